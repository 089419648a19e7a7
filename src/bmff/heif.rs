//! HEIF still images (HEIC: HEVC items; AVIF: AV1 items): the primary
//! image's coded tiles, codec configuration and display properties, read
//! from the `meta` box (ISO/IEC 23008-12). Pure: the pixels are decoded
//! elsewhere (`steps/thumbnail/heif.rs`).
//!
//! What is read: `pitm` (the primary item), `iinf` (item types), `iloc`
//! (where each item's bytes are: in the file or in `idat`), `iref` `dimg`
//! (a grid's tiles, in row-major order), `iprp` (`ipco` properties and
//! their `ipma` associations): `hvcC`/`av1C`, `ispe`, `irot`, `imir`,
//! `colr` (an ICC profile or nclx code points), `pixi`; and the alpha
//! auxiliary image (`iref` `auxl` to the primary item, `auxC` naming
//! alpha; `prem` if the colour is premultiplied), a coded image or grid
//! like the primary. A property marked essential that is not one of these
//! (a clean aperture, `clap`, say) makes the image unreadable rather than
//! shown wrong, as the standard asks. Not read: depth auxiliary images,
//! thumbnails, Exif (HEIF's `irot`/`imir` are what orient the image, as
//! libheif does).

use super::boxes::{child, children, fourcc, Cursor};
use super::BmffError;

/// The coding of a HEIF image's tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// `hvc1` items, `hvcC` configuration: HEIC.
    Hevc,
    /// `av01` items, `av1C` configuration: AVIF.
    Av1,
}

impl Codec {
    pub fn name(self) -> &'static str {
        match self {
            Codec::Hevc => "HEIC",
            Codec::Av1 => "AVIF",
        }
    }
}

/// One orientation step, in the order the file lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transform {
    /// `irot`: quarter turns anticlockwise (1 to 3).
    Rotate(u8),
    /// `imir` axis 0: about the vertical axis (left and right swap).
    MirrorLeftRight,
    /// `imir` axis 1: about the horizontal axis (top and bottom swap).
    MirrorTopBottom,
}

/// `colr` nclx: colour code points (ITU-T H.273).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nclx {
    pub primaries: u16,
    pub transfer: u16,
    pub matrix: u16,
    pub full_range: bool,
}

/// A coded image: one coded item, or a grid of them (tiles).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coded {
    pub codec: Codec,
    /// The body of the tiles' `hvcC` or `av1C` (every tile of a grid must
    /// share it).
    pub config: Vec<u8>,
    /// Each tile's coded bytes, row-major; one for an image without a grid.
    pub tiles: Vec<Vec<u8>>,
    /// Tiles across and down (1 × 1 without a grid).
    pub columns: u32,
    pub rows: u32,
    /// Each tile's size (`ispe`).
    pub tile_width: u32,
    pub tile_height: u32,
    /// The image's size before its transforms (a grid's output size; its
    /// tiles may reach past it, and are cut).
    pub width: u32,
    pub height: u32,
    /// Bits per channel (`pixi`, else 8).
    pub bit_depth: u8,
}

impl Coded {
    /// Pixels decoded, the tiles' overhang included.
    pub fn decoded_pixels(&self) -> u64 {
        (self.columns as u64 * self.tile_width as u64)
            * (self.rows as u64 * self.tile_height as u64)
    }
}

/// The primary image of a HEIF file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeifImage {
    /// The colour image.
    pub picture: Coded,
    /// Its alpha auxiliary image (`auxl` to the primary item, `auxC` of
    /// type alpha), the same size; opaque without one.
    pub alpha: Option<Coded>,
    /// Whether the colour is premultiplied by the alpha (`prem`).
    pub premultiplied: bool,
    pub transforms: Vec<Transform>,
    pub icc: Option<Vec<u8>>,
    pub nclx: Option<Nclx>,
}

/// The brand of a HEIF file (`ftyp`'s major brand, then its compatible
/// ones), if it is a still-image brand this module reads.
pub fn heif_codec(bytes: &[u8]) -> Option<Codec> {
    let (kind, body) = children_prefix(bytes)?;
    if &kind != b"ftyp" || body.len() < 8 {
        return None;
    }
    let brands = std::iter::once(&body[0..4]).chain(body[8..].chunks_exact(4));
    let mut found = None;
    for brand in brands {
        match brand {
            b"avif" | b"avis" => return Some(Codec::Av1),
            b"heic" | b"heix" | b"heim" | b"heis" => found = Some(Codec::Hevc),
            b"mif1" | b"msf1" => found = found.or(Some(Codec::Hevc)),
            _ => {}
        }
    }
    found
}

fn children_prefix(bytes: &[u8]) -> Option<([u8; 4], &[u8])> {
    let header = super::boxes::parse_header(bytes).ok()??;
    let size = header.size.unwrap_or(bytes.len() as u64);
    let end = usize::try_from(size).ok().filter(|&e| e <= bytes.len())?;
    Some((header.kind, &bytes[header.header_len as usize..end]))
}

struct Item {
    id: u32,
    kind: [u8; 4],
}

struct Location {
    id: u32,
    construction: u16,
    base: u64,
    extents: Vec<(u64, u64)>,
}

struct Property<'a> {
    kind: [u8; 4],
    body: &'a [u8],
}

fn malformed(message: impl Into<String>) -> BmffError {
    BmffError::Malformed(message.into())
}

/// The aux_type URNs of an alpha auxiliary image: AVIF's, and HEVC's
/// (ISO/IEC 23008-12 and -2).
const ALPHA_URNS: [&[u8]; 2] = [
    b"urn:mpeg:mpegB:cicp:systems:auxiliary:alpha",
    b"urn:mpeg:hevc:2015:auxid:1",
];

/// The `meta` box's tables, for looking items up.
struct Meta<'a> {
    file: &'a [u8],
    items: Vec<Item>,
    locations: Vec<Location>,
    idat: Option<&'a [u8]>,
    references: Vec<Reference>,
    ipco: Vec<Property<'a>>,
    associations: Vec<(u32, bool, u16)>,
}

impl<'a> Meta<'a> {
    fn kind_of(&self, id: u32) -> Option<[u8; 4]> {
        self.items.iter().find(|i| i.id == id).map(|i| i.kind)
    }

    /// An item's properties, with whether each is essential.
    fn properties_of(&self, id: u32) -> Vec<(bool, &Property<'a>)> {
        self.associations
            .iter()
            .filter(|(item, ..)| *item == id)
            .filter_map(|(_, essential, index)| {
                // Index 0 means "no property".
                let index = (*index as usize).checked_sub(1)?;
                self.ipco.get(index).map(|p| (*essential, p))
            })
            .collect()
    }

    fn data_of(&self, id: u32) -> Result<Vec<u8>, BmffError> {
        let location = self
            .locations
            .iter()
            .find(|l| l.id == id)
            .ok_or_else(|| malformed(format!("item {id} has no location in 'iloc'")))?;
        item_data(location, self.file, self.idat)
    }

    /// The items `from` refers to by references of `kind`.
    fn referenced(&self, kind: &[u8; 4], from: u32) -> Option<&[u32]> {
        self.references
            .iter()
            .find(|(k, f, _)| k == kind && *f == from)
            .map(|(_, _, to)| to.as_slice())
    }

    /// The coded image behind item `id`: itself, or a grid's tiles.
    fn coded(&self, id: u32) -> Result<Coded, BmffError> {
        let kind = self
            .kind_of(id)
            .ok_or_else(|| malformed(format!("item {id} not in 'iinf'")))?;
        let (tile_ids, grid) = match &kind {
            b"grid" => {
                let tiles = self
                    .referenced(b"dimg", id)
                    .ok_or_else(|| malformed("a grid without 'dimg' references to its tiles"))?
                    .to_vec();
                (tiles, Some(image_grid(&self.data_of(id)?)?))
            }
            b"hvc1" | b"av01" => (vec![id], None),
            other => {
                return Err(BmffError::NotAMovie(format!(
                    "item {id} is a '{}' item, which this build does not decode",
                    fourcc(other)
                )))
            }
        };
        let first = *tile_ids
            .first()
            .ok_or_else(|| malformed("a grid without tiles"))?;
        let codec = match self.kind_of(first) {
            Some(kind) if &kind == b"hvc1" => Codec::Hevc,
            Some(kind) if &kind == b"av01" => Codec::Av1,
            Some(kind) => {
                return Err(BmffError::NotAMovie(format!(
                    "image tiles of type '{}', which this build does not decode",
                    fourcc(&kind)
                )))
            }
            None => return Err(malformed("a tile missing from 'iinf'")),
        };
        let config_kind: &[u8; 4] = match codec {
            Codec::Hevc => b"hvcC",
            Codec::Av1 => b"av1C",
        };
        let tile_kind = self.kind_of(first);
        let mut config = None;
        let mut tile_size = None;
        let mut tiles = Vec::with_capacity(tile_ids.len());
        let mut tile_bytes = 0usize;
        for &tile in &tile_ids {
            if self.kind_of(tile) != tile_kind {
                return Err(malformed("a grid whose tiles are of different types"));
            }
            let properties = self.properties_of(tile);
            let this_config = properties
                .iter()
                .find(|(_, p)| &p.kind == config_kind)
                .map(|(_, p)| p.body)
                .ok_or_else(|| malformed(format!("tile {tile} without '{}'", fourcc(config_kind))))?;
            match config {
                None => config = Some(this_config),
                Some(first) if first != this_config => {
                    return Err(BmffError::NotAMovie(
                        "a grid whose tiles are coded with different configurations".into(),
                    ))
                }
                Some(_) => {}
            }
            let size = properties
                .iter()
                .find(|(_, p)| &p.kind == b"ispe")
                .map(|(_, p)| spatial_extent(p.body))
                .transpose()?
                .ok_or_else(|| malformed(format!("tile {tile} without 'ispe'")))?;
            match tile_size {
                None => tile_size = Some(size),
                Some(first) if first != size => {
                    return Err(malformed("a grid whose tiles differ in size"));
                }
                Some(_) => {}
            }
            let data = self.data_of(tile)?;
            // Tiles are distinct parts of the file: a grid naming one tile
            // over and over would copy the file once per mention.
            tile_bytes += data.len();
            if tile_bytes > self.file.len() {
                return Err(malformed(
                    "the grid's tiles add up to more bytes than the file holds",
                ));
            }
            tiles.push(data);
        }
        let config = config.expect("at least one tile").to_vec();
        let (tile_width, tile_height) = tile_size.expect("at least one tile");
        let mut coded = Coded {
            codec,
            config,
            columns: 1,
            rows: 1,
            tile_width,
            tile_height,
            width: tile_width,
            height: tile_height,
            tiles,
            bit_depth: 8,
        };
        if let Some(grid) = &grid {
            if grid.columns * grid.rows != tile_ids.len() as u32 {
                return Err(malformed(format!(
                    "a {}x{} grid with {} tiles",
                    grid.columns,
                    grid.rows,
                    tile_ids.len()
                )));
            }
            if grid.columns * tile_width < grid.width || grid.rows * tile_height < grid.height {
                return Err(malformed("a grid larger than its tiles cover"));
            }
            coded.columns = grid.columns;
            coded.rows = grid.rows;
            coded.width = grid.width;
            coded.height = grid.height;
        }
        // Depth may sit on the grid item or on its tiles.
        let pixi = self
            .properties_of(id)
            .into_iter()
            .chain(self.properties_of(first))
            .find(|(_, p)| &p.kind == b"pixi");
        if let Some((_, pixi)) = pixi {
            let mut cursor = Cursor::new(pixi.body, "pixi");
            cursor.version()?;
            if cursor.u8("channel count")? > 0 {
                coded.bit_depth = cursor.u8("bits per channel")?;
            }
        }
        Ok(coded)
    }

    /// The alpha auxiliary image of item `master`, if it has one: an item
    /// with an `auxl` reference to it and an `auxC` of an alpha type.
    fn alpha_of(&self, master: u32) -> Option<u32> {
        self.references
            .iter()
            .filter(|(kind, _, to)| kind == b"auxl" && to.contains(&master))
            .map(|(_, from, _)| *from)
            .find(|&aux| {
                self.properties_of(aux).iter().any(|(_, p)| {
                    &p.kind == b"auxC"
                        && p.body
                            .get(4..)
                            .map(|urn| urn.split(|&b| b == 0).next().unwrap_or(urn))
                            .is_some_and(|urn| ALPHA_URNS.contains(&urn))
                })
            })
    }

    /// Fails on a property marked essential that is not among `known`: a
    /// property HEIF says a reader must apply or not show the image.
    fn check_essential(&self, id: u32, known: &[&[u8; 4]]) -> Result<(), BmffError> {
        for (essential, property) in self.properties_of(id) {
            if essential && !known.contains(&&property.kind) {
                return Err(BmffError::NotAMovie(format!(
                    "the image has an essential '{}' property this build does not apply",
                    fourcc(&property.kind)
                )));
            }
        }
        Ok(())
    }
}

/// Reads the primary image of a HEIF file held in `bytes`.
pub fn parse_heif(bytes: &[u8]) -> Result<HeifImage, BmffError> {
    let top = children(bytes, "file")?;
    let meta = child(&top, b"meta").ok_or_else(|| malformed("a HEIF file without a 'meta' box"))?;
    let mut cursor = Cursor::new(meta, "meta");
    cursor.version()?;
    let meta = children(&meta[4..], "meta")?;
    let handler = child(&meta, b"hdlr").ok_or_else(|| malformed("'meta' without 'hdlr'"))?;
    if handler.get(8..12) != Some(b"pict") {
        return Err(malformed("'meta' is not a picture ('hdlr' is not 'pict')"));
    }
    let primary = primary_item(child(&meta, b"pitm").ok_or_else(|| malformed("no 'pitm'"))?)?;
    let iprp = child(&meta, b"iprp").ok_or_else(|| malformed("no 'iprp'"))?;
    let iprp = children(iprp, "iprp")?;
    let ipco = child(&iprp, b"ipco").ok_or_else(|| malformed("no 'ipco'"))?;
    let tables = Meta {
        file: bytes,
        items: item_infos(child(&meta, b"iinf").ok_or_else(|| malformed("no 'iinf'"))?)?,
        locations: item_locations(child(&meta, b"iloc").ok_or_else(|| malformed("no 'iloc'"))?)?,
        idat: child(&meta, b"idat"),
        references: match child(&meta, b"iref") {
            Some(iref) => item_references(iref)?,
            None => Vec::new(),
        },
        ipco: children(ipco, "ipco")?
            .into_iter()
            .map(|(kind, body)| Property { kind, body })
            .collect(),
        associations: property_associations(&iprp)?,
    };
    let picture = tables.coded(primary)?;
    let grid = tables.kind_of(primary) == Some(*b"grid");
    let first_tile = if grid {
        tables.referenced(b"dimg", primary).and_then(|t| t.first().copied())
    } else {
        None
    };
    let mut image = HeifImage {
        picture,
        alpha: None,
        premultiplied: false,
        transforms: Vec::new(),
        icc: None,
        nclx: None,
    };

    // The primary item's properties say how it is shown; a single coded
    // image carries them itself, a grid on the grid item. Colour may sit
    // on the tiles instead.
    tables.check_essential(primary, &[b"irot", b"imir", b"colr", b"pixi", b"hvcC", b"av1C", b"ispe"])?;
    let mut display = tables.properties_of(primary);
    if let Some(tile) = first_tile {
        let own: Vec<[u8; 4]> = display.iter().map(|(_, p)| p.kind).collect();
        display.extend(
            tables
                .properties_of(tile)
                .into_iter()
                .filter(|(_, p)| &p.kind == b"colr" && !own.contains(&p.kind)),
        );
    }
    for (_, property) in display {
        match &property.kind {
            b"irot" => {
                let angle = property.body.first().ok_or_else(|| malformed("empty 'irot'"))? & 3;
                if angle != 0 {
                    image.transforms.push(Transform::Rotate(angle));
                }
            }
            b"imir" => {
                let axis = property.body.first().ok_or_else(|| malformed("empty 'imir'"))? & 1;
                image.transforms.push(if axis == 0 {
                    Transform::MirrorLeftRight
                } else {
                    Transform::MirrorTopBottom
                });
            }
            b"colr" => colour(property.body, &mut image)?,
            _ => {}
        }
    }

    if let Some(alpha) = tables.alpha_of(primary) {
        tables.check_essential(alpha, &[b"auxC", b"pixi", b"hvcC", b"av1C", b"ispe", b"colr"])?;
        let coded = tables.coded(alpha)?;
        if (coded.width, coded.height) != (image.picture.width, image.picture.height) {
            return Err(BmffError::NotAMovie(format!(
                "an alpha image of {}x{} for a {}x{} image, which this build does not scale",
                coded.width, coded.height, image.picture.width, image.picture.height
            )));
        }
        // `prem`: from the colour image to its alpha.
        image.premultiplied = tables
            .referenced(b"prem", primary)
            .is_some_and(|to| to.contains(&alpha));
        image.alpha = Some(coded);
    }
    Ok(image)
}

fn primary_item(pitm: &[u8]) -> Result<u32, BmffError> {
    let mut cursor = Cursor::new(pitm, "pitm");
    Ok(if cursor.version()? == 0 {
        cursor.u16("item_ID")? as u32
    } else {
        cursor.u32("item_ID")?
    })
}

fn item_infos(iinf: &[u8]) -> Result<Vec<Item>, BmffError> {
    let mut cursor = Cursor::new(iinf, "iinf");
    let count_len = if cursor.version()? == 0 { 2 } else { 4 };
    cursor.skip(count_len, "entry_count")?;
    let mut items = Vec::new();
    for (kind, body) in children(&iinf[cursor.at..], "iinf")? {
        if &kind != b"infe" {
            continue;
        }
        let mut cursor = Cursor::new(body, "iinf/infe");
        let version = cursor.version()?;
        if version < 2 {
            // Versions 0 and 1 name no item type; no image item uses them.
            continue;
        }
        let id = if version == 2 {
            cursor.u16("item_ID")? as u32
        } else {
            cursor.u32("item_ID")?
        };
        cursor.skip(2, "item_protection_index")?;
        let kind: [u8; 4] = cursor.take(4, "item_type")?.try_into().unwrap();
        items.push(Item { id, kind });
    }
    Ok(items)
}

fn sized_field(cursor: &mut Cursor, size: u8, field: &str) -> Result<u64, BmffError> {
    match size {
        0 => Ok(0),
        4 => Ok(cursor.u32(field)? as u64),
        8 => cursor.u64(field),
        other => Err(malformed(format!("'iloc' {field} of {other} bytes"))),
    }
}

fn item_locations(iloc: &[u8]) -> Result<Vec<Location>, BmffError> {
    let mut cursor = Cursor::new(iloc, "iloc");
    let version = cursor.version()?;
    if version > 2 {
        return Err(malformed(format!("'iloc' version {version}")));
    }
    let sizes = cursor.u8("offset and length sizes")?;
    let (offset_size, length_size) = (sizes >> 4, sizes & 15);
    let sizes = cursor.u8("base offset and index sizes")?;
    let base_offset_size = sizes >> 4;
    let index_size = if version >= 1 { sizes & 15 } else { 0 };
    let count = if version < 2 {
        cursor.u16("item_count")? as u32
    } else {
        cursor.u32("item_count")?
    };
    let mut locations = Vec::new();
    for _ in 0..count {
        let id = if version < 2 {
            cursor.u16("item_ID")? as u32
        } else {
            cursor.u32("item_ID")?
        };
        let construction = if version >= 1 {
            cursor.u16("construction_method")? & 15
        } else {
            0
        };
        cursor.skip(2, "data_reference_index")?;
        let base = sized_field(&mut cursor, base_offset_size, "base_offset")?;
        let extents = cursor.u16("extent_count")?;
        let mut list = Vec::with_capacity(extents as usize);
        for _ in 0..extents {
            sized_field(&mut cursor, index_size, "extent_index")?;
            let offset = sized_field(&mut cursor, offset_size, "extent_offset")?;
            let length = sized_field(&mut cursor, length_size, "extent_length")?;
            list.push((offset, length));
        }
        locations.push(Location {
            id,
            construction,
            base,
            extents: list,
        });
    }
    Ok(locations)
}

/// An item's bytes, from the file (construction method 0) or `idat` (1).
fn item_data(location: &Location, file: &[u8], idat: Option<&[u8]>) -> Result<Vec<u8>, BmffError> {
    let source = match location.construction {
        0 => file,
        1 => idat.ok_or_else(|| malformed("an item in 'idat', and no 'idat'"))?,
        other => {
            return Err(BmffError::NotAMovie(format!(
                "item {} is built by construction method {other}, which this build does not read",
                location.id
            )))
        }
    };
    let mut data = Vec::new();
    for &(offset, length) in &location.extents {
        let start = location.base.checked_add(offset);
        // A length of 0 means "to the end".
        let end = match length {
            0 => Some(source.len() as u64),
            n => start.and_then(|s| s.checked_add(n)),
        };
        let range = start
            .zip(end)
            .filter(|&(s, e)| s <= e && e <= source.len() as u64)
            .ok_or_else(|| {
                BmffError::Truncated(format!(
                    "item {} reaches past the end of its {} bytes",
                    location.id,
                    source.len()
                ))
            })?;
        // Extents may not add up to more than their source holds: a few
        // bytes of `iloc` could otherwise ask for the whole file many
        // times over.
        if data.len() as u64 + (range.1 - range.0) > source.len() as u64 {
            return Err(malformed(format!(
                "item {}'s extents add up to more than the {} bytes they are in",
                location.id,
                source.len()
            )));
        }
        data.extend_from_slice(&source[range.0 as usize..range.1 as usize]);
    }
    Ok(data)
}

/// One `iref` entry: (reference type, from item, to items).
type Reference = ([u8; 4], u32, Vec<u32>);

/// Every reference in `iref`.
fn item_references(iref: &[u8]) -> Result<Vec<Reference>, BmffError> {
    let mut cursor = Cursor::new(iref, "iref");
    let wide = cursor.version()? != 0;
    let mut out = Vec::new();
    for (kind, body) in children(&iref[4..], "iref")? {
        let mut cursor = Cursor::new(body, "iref entry");
        let id = |c: &mut Cursor| -> Result<u32, BmffError> {
            if wide {
                c.u32("item_ID")
            } else {
                c.u16("item_ID").map(u32::from)
            }
        };
        let from = id(&mut cursor)?;
        let count = cursor.u16("reference_count")?;
        let to = (0..count)
            .map(|_| id(&mut cursor))
            .collect::<Result<_, _>>()?;
        out.push((kind, from, to));
    }
    Ok(out)
}

/// (item, essential, 1-based property index) for each association.
fn property_associations(
    iprp: &[super::boxes::Child],
) -> Result<Vec<(u32, bool, u16)>, BmffError> {
    let mut out = Vec::new();
    for (kind, body) in iprp {
        if kind != b"ipma" {
            continue;
        }
        let mut cursor = Cursor::new(body, "ipma");
        let version = cursor.u8("version")?;
        let flags = cursor.take(3, "flags")?;
        let wide_index = flags[2] & 1 == 1;
        let count = cursor.u32("entry_count")?;
        for _ in 0..count {
            let item = if version < 1 {
                cursor.u16("item_ID")? as u32
            } else {
                cursor.u32("item_ID")?
            };
            let associations = cursor.u8("association_count")?;
            for _ in 0..associations {
                let (essential, index) = if wide_index {
                    let v = cursor.u16("property_index")?;
                    (v & 0x8000 != 0, v & 0x7fff)
                } else {
                    let v = cursor.u8("property_index")?;
                    (v & 0x80 != 0, (v & 0x7f) as u16)
                };
                out.push((item, essential, index));
            }
        }
    }
    Ok(out)
}

fn spatial_extent(ispe: &[u8]) -> Result<(u32, u32), BmffError> {
    let mut cursor = Cursor::new(ispe, "ispe");
    cursor.version()?;
    let width = cursor.u32("image_width")?;
    let height = cursor.u32("image_height")?;
    if width == 0 || height == 0 {
        return Err(malformed(format!("'ispe' of {width}x{height}")));
    }
    Ok((width, height))
}

struct Grid {
    columns: u32,
    rows: u32,
    width: u32,
    height: u32,
}

fn image_grid(data: &[u8]) -> Result<Grid, BmffError> {
    let mut cursor = Cursor::new(data, "grid");
    let version = cursor.u8("version")?;
    if version != 0 {
        return Err(malformed(format!("grid version {version}")));
    }
    let flags = cursor.u8("flags")?;
    let rows = cursor.u8("rows_minus_one")? as u32 + 1;
    let columns = cursor.u8("columns_minus_one")? as u32 + 1;
    let (width, height) = if flags & 1 == 0 {
        (
            cursor.u16("output_width")? as u32,
            cursor.u16("output_height")? as u32,
        )
    } else {
        (cursor.u32("output_width")?, cursor.u32("output_height")?)
    };
    if width == 0 || height == 0 {
        return Err(malformed(format!("a grid of {width}x{height}")));
    }
    Ok(Grid {
        columns,
        rows,
        width,
        height,
    })
}

fn colour(body: &[u8], image: &mut HeifImage) -> Result<(), BmffError> {
    let mut cursor = Cursor::new(body, "colr");
    let kind = cursor.take(4, "colour_type")?;
    match kind {
        b"nclx" => {
            image.nclx = Some(Nclx {
                primaries: cursor.u16("colour_primaries")?,
                transfer: cursor.u16("transfer_characteristics")?,
                matrix: cursor.u16("matrix_coefficients")?,
                full_range: cursor.u8("full_range_flag")? & 0x80 != 0,
            })
        }
        b"prof" | b"rICC" => image.icc = Some(body[4..].to_vec()),
        _ => {}
    }
    Ok(())
}
