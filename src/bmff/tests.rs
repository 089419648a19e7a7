use super::fragments::*;
use super::movie::*;
use super::*;

/// A box: size, type, body.
fn bx(kind: &[u8; 4], body: &[u8]) -> Vec<u8> {
    let mut out = ((body.len() + 8) as u32).to_be_bytes().to_vec();
    out.extend_from_slice(kind);
    out.extend_from_slice(body);
    out
}

fn full(version: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![version, 0, 0, 0];
    out.extend_from_slice(body);
    out
}

fn be32(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_be_bytes()).collect()
}

fn mvhd(timescale: u32, duration: u32) -> Vec<u8> {
    let mut body = be32(&[0, 0, timescale, duration]);
    body.resize(96, 0);
    bx(b"mvhd", &full(0, &body))
}

/// A video track of `frames` frames of `delta` ticks at `timescale`,
/// each `frame_bytes` long.
fn video_trak(frames: u32, delta: u32, timescale: u32, frame_bytes: u32) -> Vec<u8> {
    let mut tkhd = be32(&[0, 0, 1, 0, frames * delta, 0, 0, 0, 0]);
    for v in [0x10000u32, 0, 0, 0, 0x10000, 0, 0, 0, 0x4000_0000] {
        tkhd.extend_from_slice(&v.to_be_bytes());
    }
    tkhd.extend(be32(&[640 << 16, 360 << 16]));
    let mut mdhd = be32(&[0, 0, timescale, frames * delta]);
    mdhd.extend_from_slice(&[0x15, 0xc7, 0, 0]); // "eng"
    let hdlr = full(0, &[&be32(&[0])[..], b"vide", &[0; 12], b"\0"].concat());
    let mut entry = vec![0u8; 6];
    entry.extend_from_slice(&1u16.to_be_bytes());
    entry.extend_from_slice(&[0; 16]);
    entry.extend_from_slice(&640u16.to_be_bytes());
    entry.extend_from_slice(&360u16.to_be_bytes());
    entry.extend_from_slice(&[0; 50]);
    entry.extend(bx(b"avcC", &[1, 0x64, 0, 0x1f, 0xff]));
    let stsd = full(0, &[be32(&[1]), bx(b"avc1", &entry)].concat());
    let stts = full(0, &be32(&[1, frames, delta]));
    let stsz = full(0, &be32(&[frame_bytes, frames]));
    let stbl = bx(
        b"stbl",
        &[bx(b"stsd", &stsd), bx(b"stts", &stts), bx(b"stsz", &stsz)].concat(),
    );
    let minf = bx(b"minf", &stbl);
    let mdia = bx(
        b"mdia",
        &[bx(b"mdhd", &full(0, &mdhd)), bx(b"hdlr", &hdlr), minf].concat(),
    );
    bx(b"trak", &[bx(b"tkhd", &full(0, &tkhd)), mdia].concat())
}

fn movie(moov_at_end: bool, mdat_len: usize) -> Vec<u8> {
    let ftyp = bx(b"ftyp", b"isom\0\0\x02\0isomiso2avc1mp41");
    let moov = bx(
        b"moov",
        &[mvhd(1000, 10_000), video_trak(250, 512, 12800, 4000)].concat(),
    );
    let mdat = bx(b"mdat", &vec![0xAB; mdat_len]);
    if moov_at_end {
        [ftyp, mdat, moov].concat()
    } else {
        [ftyp, moov, mdat].concat()
    }
}

#[test]
fn data_references_outside_the_file_are_named() {
    let dref = |entries: &[Vec<u8>]| {
        full(
            0,
            &[be32(&[entries.len() as u32]), entries.concat()].concat(),
        )
    };
    let url = |flags: u8, location: &[u8]| bx(b"url ", &[&[0, 0, 0, flags][..], location].concat());
    assert_eq!(external_reference(&dref(&[url(1, b"")])).unwrap(), None);
    assert_eq!(
        external_reference(&dref(&[url(1, b""), url(0, b"file:///etc/passwd\0")])).unwrap(),
        Some("'url ' \"file:///etc/passwd\"".into())
    );
    let alias = bx(b"alis", &[0, 0, 0, 0, 1, 2, 3]);
    assert_eq!(
        external_reference(&dref(&[alias])).unwrap(),
        Some("'alis' 3 bytes".into())
    );
    let self_alias = bx(b"alis", &[0, 0, 0, 1]);
    assert_eq!(external_reference(&dref(&[self_alias])).unwrap(), None);
    // An entry shorter than its flags is malformed, not waved through.
    assert!(external_reference(&dref(&[bx(b"url ", &[0])])).is_err());
}

async fn info_of(bytes: &[u8]) -> Result<(MovieInfo, MovieBoxes), BmffError> {
    let boxes = locate_movie(bytes, bytes.len() as u64, &[]).await?;
    let info = parse_boxes(&boxes)?;
    Ok((info, boxes))
}

#[tokio::test]
async fn a_movie_reports_brand_duration_and_track() {
    let (info, _) = info_of(&movie(false, 100)).await.unwrap();
    assert_eq!(info.major_brand.as_deref(), Some("isom"));
    assert_eq!(info.compatible_brands, ["isom", "iso2", "avc1", "mp41"]);
    assert_eq!(info.duration, Some(10.0));
    let video = info.video().unwrap();
    assert_eq!(video.codec.as_deref(), Some("avc1"));
    assert_eq!(video.codecs.as_deref(), Some("avc1.64001f"));
    assert_eq!((video.width, video.height), (Some(640), Some(360)));
    assert_eq!(video.frame_rate, Some(25.0));
    assert_eq!(video.samples, 250);
    assert_eq!(video.bitrate, Some(800_000));
    assert_eq!(video.rotation, Some(0));
    assert_eq!(video.language.as_deref(), Some("eng"));
    assert!(info.audio().is_none());
}

#[tokio::test]
async fn a_moov_at_the_end_of_a_large_file_costs_two_reads() {
    let bytes = movie(true, 50 * 1024 * 1024);
    let (info, boxes) = info_of(&bytes).await.unwrap();
    assert_eq!(info.duration, Some(10.0));
    assert_eq!(boxes.reads, 2, "{boxes:?}");
    assert!(boxes.bytes_read < 2 * WINDOW_BYTES);
}

#[tokio::test]
async fn bytes_at_hand_save_the_first_read() {
    let bytes = movie(false, 10);
    let boxes = locate_movie(&bytes[..], bytes.len() as u64, &bytes)
        .await
        .unwrap();
    assert_eq!(boxes.reads, 0);
}

#[tokio::test]
async fn truncated_files_are_errors_naming_the_box() {
    let bytes = movie(true, 1000);
    for cut in [bytes.len() - 1, bytes.len() - 200, 1100, 30, 5] {
        let err = info_of(&bytes[..cut]).await.unwrap_err();
        assert!(
            matches!(err, BmffError::Truncated(_) | BmffError::NotAMovie(_)),
            "cut at {cut}: {err}"
        );
    }
    let err = info_of(&bytes[..bytes.len() - 1]).await.unwrap_err();
    assert!(err.to_string().contains("box 'moov'"), "{err}");
    // Cut in the middle of the mdat of a faststart file.
    let bytes = movie(false, 1000);
    let err = info_of(&bytes[..bytes.len() - 10]).await.unwrap_err();
    assert!(err.to_string().contains("'mdat'"), "{err}");
}

#[tokio::test]
async fn a_file_without_moov_is_not_a_movie() {
    let bytes = [bx(b"ftyp", b"isom\0\0\0\0"), bx(b"mdat", &[0; 10])].concat();
    let err = info_of(&bytes).await.unwrap_err();
    assert!(err.to_string().contains("no 'moov'"), "{err}");
    let err = info_of(b"GIF89a\x05\x00\x07\x00\x00\x00\x00")
        .await
        .unwrap_err();
    assert!(
        matches!(err, BmffError::NotAMovie(_) | BmffError::Malformed(_)),
        "{err}"
    );
}

#[tokio::test]
async fn lying_sizes_are_errors() {
    // A box smaller than its header.
    let mut bytes = movie(false, 10);
    bytes[0..4].copy_from_slice(&4u32.to_be_bytes());
    let err = info_of(&bytes).await.unwrap_err();
    assert!(
        err.to_string().contains("less than its 8-byte header"),
        "{err}"
    );

    // A child reaching past its parent: the first trak's size grown.
    let mut bytes = movie(false, 10);
    let at = find(&bytes, b"trak") - 4;
    let size = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    bytes[at..at + 4].copy_from_slice(&(size + 1000).to_be_bytes());
    let err = info_of(&bytes).await.unwrap_err();
    assert!(err.to_string().contains("'moov/trak' declares"), "{err}");

    // A sample table declaring more entries than it holds.
    let mut bytes = movie(false, 10);
    let at = find(&bytes, b"stts") + 8;
    bytes[at..at + 4].copy_from_slice(&0x4000_0000u32.to_be_bytes());
    let err = info_of(&bytes).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("'stts' declares 1073741824 entries"),
        "{err}"
    );

    // A 64-bit size far past the end.
    let mut bytes = bx(b"ftyp", b"isom\0\0\0\0");
    bytes.extend_from_slice(&1u32.to_be_bytes());
    bytes.extend_from_slice(b"mdat");
    bytes.extend_from_slice(&u64::MAX.to_be_bytes());
    let err = info_of(&bytes).await.unwrap_err();
    assert!(matches!(err, BmffError::Truncated(_)), "{err}");
}

#[tokio::test]
async fn a_huge_moov_is_refused_before_it_is_read() {
    let mut bytes = bx(b"ftyp", b"isom\0\0\0\0");
    bytes.extend_from_slice(&1u32.to_be_bytes());
    bytes.extend_from_slice(b"moov");
    bytes.extend_from_slice(&(MAX_MOOV_BYTES + 100).to_be_bytes());
    bytes.resize(bytes.len() + MAX_MOOV_BYTES as usize + 100 - 16, 0);
    let err = info_of(&bytes).await.unwrap_err();
    assert!(matches!(err, BmffError::TooLarge(_)), "{err}");
}

#[test]
fn every_truncation_of_a_moov_is_an_error_or_a_parse_never_a_panic() {
    let bytes = movie(false, 0);
    let moov_at = find(&bytes, b"moov") + 4;
    let moov_len =
        u32::from_be_bytes(bytes[moov_at - 8..moov_at - 4].try_into().unwrap()) as usize - 8;
    let moov = &bytes[moov_at..moov_at + moov_len];
    for cut in 0..moov.len() {
        let _ = parse_movie(None, &moov[..cut], 0);
    }
    // And every single-byte corruption.
    for at in 0..moov.len() {
        let mut moov = moov.to_vec();
        moov[at] ^= 0xff;
        let _ = parse_movie(None, &moov, 0);
    }
}

#[test]
fn language_and_rotation() {
    assert_eq!(language(0x15c7).as_deref(), Some("eng"));
    assert_eq!(language(0x55c4), None); // und
    const ONE: i32 = 0x10000;
    assert_eq!(rotation(&[0, ONE, 0, -ONE, 0, 0, 0, 0, 0]), Some(90));
    assert_eq!(rotation(&[-ONE, 0, 0, 0, -ONE, 0, 0, 0, 0]), Some(180));
    assert_eq!(rotation(&[0, -ONE, 0, ONE, 0, 0, 0, 0, 0]), Some(270));
    assert_eq!(rotation(&[ONE, ONE, 0, ONE, ONE, 0, 0, 0, 0]), None);
}

#[test]
fn aac_codec_string_rate_and_channels() {
    // ES (3) > DecoderConfig (4, object type 0x40) > specific info (5):
    // AOT 2, frequency index 3 (48 kHz), channel configuration 1.
    let mut esds = vec![0, 0, 0, 0, 3, 25, 0, 1, 0, 4, 17, 0x40, 0x15];
    esds.extend_from_slice(&[0; 11]);
    esds.extend_from_slice(&[5, 2, 0b0001_0001, 0b1000_1000]);
    assert_eq!(
        parse_esds(&esds),
        Some(AudioConfig {
            codecs: "mp4a.40.2".into(),
            sample_rate: Some(48_000),
            channels: Some(1),
        })
    );
    // HE-AAC's escape: AOT 31 + 6 bits.
    let config = audio_specific_config(0x40, &[0b1111_1000, 0b0010_0000, 0, 0]);
    assert_eq!(config.codecs, "mp4a.40.33");
}

#[test]
fn a_fragment_ends_at_its_decode_time_plus_its_samples() {
    let tfhd = bx(b"tfhd", &be32(&[0x08, 1, 512])); // default duration 512
    let tfdt = bx(b"tfdt", &full(0, &be32(&[25_600])));
    // Two samples with their own durations, then a run of defaults.
    let trun = bx(b"trun", &be32(&[0x100, 2, 1000, 1024]));
    let defaults_run = bx(b"trun", &be32(&[0, 3]));
    let traf = [tfhd.clone(), tfdt.clone(), trun, defaults_run].concat();
    let none = std::collections::HashMap::new();
    let no_times = std::collections::HashMap::new();
    assert_eq!(
        traf_end(&traf, &none, &no_times).unwrap(),
        Some((1, 25_600 + 1000 + 1024 + 3 * 512))
    );
    // A count of four billion samples and no per-sample fields: one
    // multiplication, not four billion turns of a loop.
    let lying = [
        tfhd.clone(),
        tfdt.clone(),
        bx(b"trun", &be32(&[0, u32::MAX])),
    ]
    .concat();
    assert_eq!(
        traf_end(&lying, &none, &no_times).unwrap(),
        Some((1, 25_600 + u32::MAX as u64 * 512))
    );
    // Per-sample fields the box does not hold.
    let short = [tfhd, tfdt, bx(b"trun", &be32(&[0x300, 1000, 1]))].concat();
    assert!(traf_end(&short, &none, &no_times).is_err());
}

fn find(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap()
}
