//! HEIC and AVIF files for tests: tiles coded by the pinned ffmpeg
//! (libx265, libaom), put into a HEIF container written here, the way a
//! phone lays one out (a grid item over coded tiles, its data in `idat`,
//! properties shared through `ipma`).

use super::media::clip;

/// How a tile is coded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Hevc,
    Av1,
}

/// A tile of one colour (an ffmpeg colour name or 0xRRGGBB), `size` × `size`,
/// coded by ffmpeg: HEVC in Annex B, AV1 as low-overhead OBUs.
pub fn tile(codec: Codec, colour: &str, size: u32) -> Vec<u8> {
    coded(
        codec,
        &format!("color=c={colour}:s={size}x{size}:d=1"),
        colour,
        size,
    )
}

/// A tile of ffmpeg's busy test pattern (far more bytes than a flat one).
pub fn pattern_tile(codec: Codec, size: u32) -> Vec<u8> {
    coded(
        codec,
        &format!("testsrc2=s={size}x{size}:d=1"),
        "pattern",
        size,
    )
}

/// A tile of one grey level, coded monochrome: an alpha image's tile.
pub fn alpha_tile(codec: Codec, level: u8, size: u32) -> Vec<u8> {
    coded_as(
        codec,
        &format!("color=c=0x{level:02x}{level:02x}{level:02x}:s={size}x{size}:d=1"),
        &format!("alpha{level}"),
        size,
        "gray",
    )
}

fn coded(codec: Codec, source: &str, colour: &str, size: u32) -> Vec<u8> {
    coded_as(codec, source, colour, size, "yuv420p")
}

fn coded_as(codec: Codec, source: &str, colour: &str, size: u32, pix_fmt: &str) -> Vec<u8> {
    let (name, args): (String, Vec<&str>) = match codec {
        Codec::Hevc => (
            format!("{colour}-{size}-{pix_fmt}.hevc"),
            vec![
                "-c:v",
                "libx265",
                "-x265-params",
                "log-level=none",
                "-pix_fmt",
                pix_fmt,
                "-f",
                "hevc",
            ],
        ),
        Codec::Av1 => (
            format!("{colour}-{size}-{pix_fmt}.obu"),
            vec![
                "-c:v",
                "libaom-av1",
                "-cpu-used",
                "8",
                "-pix_fmt",
                pix_fmt,
                "-f",
                "obu",
            ],
        ),
    };
    let mut all = vec!["-f", "lavfi", "-i", source, "-frames:v", "1"];
    all.extend(args);
    std::fs::read(clip(&name, &all)).unwrap()
}

/// NAL units of an Annex B stream, without their start codes.
fn nal_units(stream: &[u8]) -> Vec<&[u8]> {
    let mut starts = Vec::new();
    let mut i = 0;
    while i + 3 <= stream.len() {
        if stream[i..i + 3] == [0, 0, 1] {
            starts.push(i + 3);
            i += 3;
        } else {
            i += 1;
        }
    }
    starts
        .iter()
        .enumerate()
        .map(|(n, &start)| {
            let mut end = starts.get(n + 1).map_or(stream.len(), |&next| next - 3);
            // A four-byte start code leaves a zero behind.
            while end > start && stream[end - 1] == 0 {
                end -= 1;
            }
            &stream[start..end]
        })
        .collect()
}

/// (hvcC body, the tile's length-prefixed slices) from an Annex B stream.
fn hevc_item(stream: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut arrays: Vec<(u8, Vec<&[u8]>)> = Vec::new();
    let mut data = Vec::new();
    for nal in nal_units(stream) {
        let kind = (nal[0] >> 1) & 0x3f;
        if (32..=34).contains(&kind) {
            match arrays.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, list)) => list.push(nal),
                None => arrays.push((kind, vec![nal])),
            }
        } else if kind < 32 {
            data.extend_from_slice(&(nal.len() as u32).to_be_bytes());
            data.extend_from_slice(nal);
        }
    }
    // configurationVersion 1; the profile fields are not read by decoders
    // of an Annex B stream; lengthSizeMinusOne 3.
    let mut config = vec![1u8];
    config.extend_from_slice(&[0; 20]);
    config.push(0b1111_1100 | 3);
    config.push(arrays.len() as u8);
    for (kind, list) in arrays {
        config.push(0x80 | kind);
        config.extend_from_slice(&(list.len() as u16).to_be_bytes());
        for nal in list {
            config.extend_from_slice(&(nal.len() as u16).to_be_bytes());
            config.extend_from_slice(nal);
        }
    }
    (config, data)
}

/// OBUs of a low-overhead stream: (type, whole OBU).
fn obus(stream: &[u8]) -> Vec<(u8, &[u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < stream.len() {
        let header = stream[at];
        let kind = (header >> 3) & 15;
        let extension = header & 4 != 0;
        let mut i = at + 1 + extension as usize;
        let (mut size, mut shift) = (0usize, 0);
        loop {
            let b = stream[i];
            size |= ((b & 0x7f) as usize) << shift;
            i += 1;
            shift += 7;
            if b & 0x80 == 0 {
                break;
            }
        }
        out.push((kind, &stream[at..i + size]));
        at = i + size;
    }
    out
}

/// (av1C body, the tile's OBUs without temporal delimiters).
fn av1_item(stream: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut config = vec![0x81, 0x00, 0x0c, 0x00];
    let mut data = Vec::new();
    for (kind, obu) in obus(stream) {
        match kind {
            // Temporal delimiter: not in an item.
            2 => {}
            // Sequence header: in the configuration, and kept in the item.
            1 => {
                if config.len() == 4 {
                    config.extend_from_slice(obu);
                }
                data.extend_from_slice(obu);
            }
            _ => data.extend_from_slice(obu),
        }
    }
    (config, data)
}

fn boxed(kind: &[u8; 4], body: &[u8]) -> Vec<u8> {
    let mut out = ((body.len() + 8) as u32).to_be_bytes().to_vec();
    out.extend_from_slice(kind);
    out.extend_from_slice(body);
    out
}

fn full(kind: &[u8; 4], version: u8, flags: u32, body: &[u8]) -> Vec<u8> {
    let mut inner = vec![version];
    inner.extend_from_slice(&flags.to_be_bytes()[1..]);
    inner.extend_from_slice(body);
    boxed(kind, &inner)
}

/// What the file says about showing the image.
#[derive(Debug, Clone, Default)]
pub struct Display {
    /// `irot`: anticlockwise quarter turns.
    pub rotate: u8,
    /// `imir` axis (0: left-right, 1: top-bottom).
    pub mirror: Option<u8>,
    /// `colr` prof.
    pub icc: Option<Vec<u8>>,
    /// `colr` nclx: primaries, transfer, matrix, full range.
    pub nclx: Option<(u16, u16, u16, bool)>,
    /// An alpha image: its tiles (from [`alpha_tile`]), laid out as the
    /// colour image's; `auxl` to the primary item, `auxC` naming alpha.
    pub alpha: Option<Vec<Vec<u8>>>,
    /// `prem`: the colour is premultiplied by the alpha.
    pub premultiplied: bool,
}

/// A HEIF file: `tiles` (coded streams from [`tile`], row-major) in a
/// `columns`-wide grid of `width` × `height` (one tile: no grid item).
pub fn heif(
    codec: Codec,
    tiles: &[Vec<u8>],
    tile_size: u32,
    columns: u8,
    (width, height): (u32, u32),
    display: &Display,
) -> Vec<u8> {
    let item = |t: &Vec<u8>| match codec {
        Codec::Hevc => hevc_item(t),
        Codec::Av1 => av1_item(t),
    };
    let items: Vec<(Vec<u8>, Vec<u8>)> = tiles.iter().map(item).collect();
    let alpha_items: Vec<(Vec<u8>, Vec<u8>)> = display.alpha.iter().flatten().map(item).collect();
    let (item_type, config_type, brand): (&[u8; 4], &[u8; 4], &[u8; 4]) = match codec {
        Codec::Hevc => (b"hvc1", b"hvcC", b"heic"),
        Codec::Av1 => (b"av01", b"av1C", b"avif"),
    };
    let grid = tiles.len() > 1;
    let alpha = !alpha_items.is_empty();
    // Item ids: tiles 1..=n, the grid n + 1; then the alpha image's tiles
    // and its grid, the same way.
    let n = tiles.len() as u16;
    let primary = if grid { n + 1 } else { 1 };
    let alpha_first = primary + 1;
    let alpha_primary = if grid { alpha_first + n } else { alpha_first };
    let alpha_ids: Vec<u16> = (alpha_first..alpha_first + alpha_items.len() as u16).collect();

    let mut ftyp = brand.to_vec();
    ftyp.extend_from_slice(&[0; 4]);
    ftyp.extend_from_slice(b"mif1");
    ftyp.extend_from_slice(brand);
    let ftyp = boxed(b"ftyp", &ftyp);

    // Properties: 1 config, 2 tile ispe, 3 image ispe, then display ones,
    // then the alpha image's config and auxC.
    let ispe = |w: u32, h: u32| {
        let mut b = w.to_be_bytes().to_vec();
        b.extend_from_slice(&h.to_be_bytes());
        full(b"ispe", 0, 0, &b)
    };
    let mut ipco = boxed(config_type, &items[0].0);
    ipco.extend(ispe(tile_size, tile_size));
    ipco.extend(ispe(width, height));
    let mut shown: Vec<u8> = vec![3];
    let mut next = 4u8;
    if let Some(icc) = &display.icc {
        let mut b = b"prof".to_vec();
        b.extend_from_slice(icc);
        ipco.extend(boxed(b"colr", &b));
        shown.push(next);
        next += 1;
    }
    if let Some((p, t, m, full_range)) = display.nclx {
        let mut b = b"nclx".to_vec();
        for v in [p, t, m] {
            b.extend_from_slice(&v.to_be_bytes());
        }
        b.push(if full_range { 0x80 } else { 0 });
        ipco.extend(boxed(b"colr", &b));
        shown.push(next);
        next += 1;
    }
    if display.rotate != 0 {
        ipco.extend(boxed(b"irot", &[display.rotate]));
        shown.push(0x80 | next);
        next += 1;
    }
    if let Some(axis) = display.mirror {
        ipco.extend(boxed(b"imir", &[axis]));
        shown.push(0x80 | next);
        next += 1;
    }
    let (alpha_config, aux_c) = (next, next + 1);
    if alpha {
        ipco.extend(boxed(config_type, &alpha_items[0].0));
        let urn: &[u8] = match codec {
            Codec::Hevc => b"urn:mpeg:hevc:2015:auxid:1\0",
            Codec::Av1 => b"urn:mpeg:mpegB:cicp:systems:auxiliary:alpha\0",
        };
        ipco.extend(full(b"auxC", 0, 0, urn));
    }
    let mut ipma = Vec::new();
    let entries = (if grid { n as u32 + 1 } else { 1 }) * if alpha { 2 } else { 1 };
    ipma.extend_from_slice(&entries.to_be_bytes());
    for id in 1..=n {
        ipma.extend_from_slice(&id.to_be_bytes());
        if grid {
            ipma.extend_from_slice(&[2, 0x81, 2]);
        } else {
            // The single coded image carries the display properties.
            ipma.push(2 + shown.len() as u8 - 1);
            ipma.extend_from_slice(&[0x81, 2]);
            ipma.extend_from_slice(&shown[1..]);
        }
    }
    if grid {
        ipma.extend_from_slice(&primary.to_be_bytes());
        ipma.push(shown.len() as u8);
        ipma.extend_from_slice(&shown);
    }
    for &id in &alpha_ids {
        ipma.extend_from_slice(&id.to_be_bytes());
        if grid {
            ipma.extend_from_slice(&[2, 0x80 | alpha_config, 2]);
        } else {
            ipma.extend_from_slice(&[3, 0x80 | alpha_config, 2, 0x80 | aux_c]);
        }
    }
    if grid && alpha {
        ipma.extend_from_slice(&alpha_primary.to_be_bytes());
        ipma.extend_from_slice(&[2, 3, 0x80 | aux_c]);
    }
    let iprp = boxed(
        b"iprp",
        &[boxed(b"ipco", &ipco), full(b"ipma", 0, 0, &ipma)].concat(),
    );

    let mut hdlr = vec![0u8; 4];
    hdlr.extend_from_slice(b"pict");
    hdlr.extend_from_slice(&[0; 13]);
    let hdlr = full(b"hdlr", 0, 0, &hdlr);
    let pitm = full(b"pitm", 0, 0, &primary.to_be_bytes());
    let infe = |id: u16, kind: &[u8; 4]| {
        let mut b = id.to_be_bytes().to_vec();
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(kind);
        b.push(0);
        full(b"infe", 2, 0, &b)
    };
    let mut iinf = (entries as u16).to_be_bytes().to_vec();
    for id in 1..=n {
        iinf.extend(infe(id, item_type));
    }
    if grid {
        iinf.extend(infe(primary, b"grid"));
    }
    for &id in &alpha_ids {
        iinf.extend(infe(id, item_type));
    }
    if grid && alpha {
        iinf.extend(infe(alpha_primary, b"grid"));
    }
    let iinf = full(b"iinf", 0, 0, &iinf);
    let reference = |kind: &[u8; 4], from: u16, to: &[u16]| {
        let mut b = from.to_be_bytes().to_vec();
        b.extend_from_slice(&(to.len() as u16).to_be_bytes());
        for id in to {
            b.extend_from_slice(&id.to_be_bytes());
        }
        boxed(kind, &b)
    };
    let mut references = Vec::new();
    if grid {
        references.extend(reference(b"dimg", primary, &(1..=n).collect::<Vec<_>>()));
    }
    if alpha {
        if grid {
            references.extend(reference(b"dimg", alpha_primary, &alpha_ids));
        }
        references.extend(reference(b"auxl", alpha_primary, &[primary]));
        if display.premultiplied {
            references.extend(reference(b"prem", primary, &[alpha_primary]));
        }
    }
    let iref = if references.is_empty() {
        Vec::new()
    } else {
        full(b"iref", 0, 0, &references)
    };
    // The grid's description, in idat (both grids share it).
    let rows = (tiles.len() as u8).div_ceil(columns);
    let mut grid_data = vec![0u8, 0, rows - 1, columns - 1];
    grid_data.extend_from_slice(&(width as u16).to_be_bytes());
    grid_data.extend_from_slice(&(height as u16).to_be_bytes());
    let idat = if grid {
        boxed(b"idat", &grid_data)
    } else {
        Vec::new()
    };
    // iloc v1: 4-byte offsets and lengths, no base offset; tiles in mdat
    // (construction method 0), grids in idat (1).
    let coded_ids: Vec<u16> = (1..=n).chain(alpha_ids.iter().copied()).collect();
    let coded_items: Vec<&(Vec<u8>, Vec<u8>)> = items.iter().chain(&alpha_items).collect();
    let grids: Vec<u16> = match (grid, alpha) {
        (false, _) => vec![],
        (true, false) => vec![primary],
        (true, true) => vec![primary, alpha_primary],
    };
    let iloc = |mdat_start: u32| {
        let mut b = vec![0x44, 0x00];
        b.extend_from_slice(&(entries as u16).to_be_bytes());
        let mut offset = mdat_start;
        for (id, (_, data)) in coded_ids.iter().zip(&coded_items) {
            b.extend_from_slice(&id.to_be_bytes());
            b.extend_from_slice(&[0, 0, 0, 0, 0, 1]);
            b.extend_from_slice(&offset.to_be_bytes());
            b.extend_from_slice(&(data.len() as u32).to_be_bytes());
            offset += data.len() as u32;
        }
        for id in &grids {
            b.extend_from_slice(&id.to_be_bytes());
            b.extend_from_slice(&[0, 1, 0, 0, 0, 1]);
            b.extend_from_slice(&0u32.to_be_bytes());
            b.extend_from_slice(&(grid_data.len() as u32).to_be_bytes());
        }
        full(b"iloc", 1, 0, &b)
    };
    let meta = |mdat_start: u32| {
        full(
            b"meta",
            0,
            0,
            &[
                hdlr.clone(),
                pitm.clone(),
                iinf.clone(),
                iref.clone(),
                iprp.clone(),
                iloc(mdat_start),
                idat.clone(),
            ]
            .concat(),
        )
    };
    let mdat_start = (ftyp.len() + meta(0).len() + 8) as u32;
    let mdat: Vec<u8> = coded_items.iter().flat_map(|(_, d)| d.clone()).collect();
    [ftyp, meta(mdat_start), boxed(b"mdat", &mdat)].concat()
}
