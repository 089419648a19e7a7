// Parses an HLS playlist with video.js' m3u8-parser (what video.js and
// its http-streaming read): prints {"manifest": …, "warnings": […]} as
// JSON. Usage: node m3u8.mjs PLAYLIST
import { readFileSync } from 'node:fs';
import { Parser } from 'm3u8-parser';

const parser = new Parser();
const warnings = [];
parser.on('warn', (warning) => warnings.push(warning.message));
parser.push(readFileSync(process.argv[2], 'utf8'));
parser.end();
process.stdout.write(JSON.stringify({ manifest: parser.manifest, warnings }));
