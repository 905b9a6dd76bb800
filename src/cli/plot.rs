//! Bar charts of a marginal release, one small chart per column with each cell's confidence interval, as SVG or
//! PNG. Both formats draw the same primitives; the PNG is rasterised here (a 3×5 pixel font, an uncompressed
//! zlib stream), so no font files or image libraries are needed.

use dpfusion::DpError;
use dpfusion::marginals::MarginalRelease;
use std::path::Path;

type Rgb = [u8; 3];
const BAR: Rgb = [0x4c, 0x78, 0xa8];
const ERR: Rgb = [0xd6, 0x27, 0x28];
const INK: Rgb = [0x33, 0x33, 0x33];

/// Where the primitives go.
trait Canvas {
    fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, c: Rgb);
    fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, c: Rgb);
    fn text(&mut self, x: f64, y: f64, s: &str, centred: bool);
}

const W: f64 = 260.0;
const H: f64 = 170.0;
const PER_ROW: usize = 4;
/// At most this many columns are drawn.
pub(crate) const MAX_CHARTS: usize = 120;

fn size(r: &MarginalRelease) -> (f64, f64) {
    let rows = r.columns().len().min(MAX_CHARTS).div_ceil(PER_ROW).max(1);
    (W * PER_ROW as f64, H * rows as f64 + 20.0)
}

fn draw(r: &MarginalRelease, c: &mut dyn Canvas) {
    let ci = r.plan().ci_half_width;
    let (_, height) = size(r);
    c.text(
        6.0,
        height - 8.0,
        &format!(
            "noisy counts, bars +- {ci} ({}% per cell), sigma {:.3}, rho {:.4}",
            r.plan().confidence * 100.0,
            r.plan().sigma,
            r.charge().rho().get()
        ),
        false,
    );
    for (i, col) in r.columns().iter().take(MAX_CHARTS).enumerate() {
        let (x0, y0) = ((i % PER_ROW) as f64 * W, (i / PER_ROW) as f64 * H);
        let top = col.counts.iter().map(|v| v + ci).fold(1.0f64, f64::max);
        let (pw, ph, left, base) = (W - 30.0, H - 50.0, x0 + 20.0, y0 + H - 25.0);
        let bw = pw / col.counts.len().max(1) as f64;
        c.text(left, y0 + 14.0, &col.column, false);
        c.line(left, base, left + pw, base, INK);
        for (j, v) in col.counts.iter().enumerate() {
            let bh = (v.max(0.0) / top) * ph;
            let bx = left + j as f64 * bw;
            c.rect(bx + bw * 0.1, base - bh, bw * 0.8, bh, BAR);
            let (lo, hi) = (base - ((v - ci).max(0.0) / top) * ph, base - ((v + ci) / top) * ph);
            let cx = bx + bw / 2.0;
            c.line(cx, lo, cx, hi, ERR);
            if col.counts.len() <= 16 {
                c.text(cx, base + 11.0, &col.keys[j], true);
            }
        }
    }
}

struct Svg(String);

fn xml(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('\'', "&apos;")
}

fn hex(c: Rgb) -> String {
    format!("#{:02x}{:02x}{:02x}", c[0], c[1], c[2])
}

impl Canvas for Svg {
    fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, c: Rgb) {
        self.0.push_str(&format!("<rect x='{x:.1}' y='{y:.1}' width='{w:.1}' height='{h:.1}' fill='{}'/>\n", hex(c)));
    }
    fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, c: Rgb) {
        self.0.push_str(&format!("<line x1='{x1:.1}' y1='{y1:.1}' x2='{x2:.1}' y2='{y2:.1}' stroke='{}'/>\n", hex(c)));
    }
    fn text(&mut self, x: f64, y: f64, s: &str, centred: bool) {
        let anchor = if centred { " text-anchor='middle'" } else { "" };
        self.0.push_str(&format!("<text x='{x:.1}' y='{y:.1}'{anchor}>{}</text>\n", xml(s)));
    }
}

/// An RGB raster.
struct Raster {
    w: usize,
    h: usize,
    px: Vec<u8>,
}

/// 3×5 glyphs, rows top to bottom, 3 bits each (most significant bit on the left).
fn glyph(ch: char) -> [u8; 5] {
    match ch.to_ascii_lowercase() {
        '0' => [7, 5, 5, 5, 7],
        '1' => [2, 6, 2, 2, 7],
        '2' => [7, 1, 7, 4, 7],
        '3' => [7, 1, 3, 1, 7],
        '4' => [5, 5, 7, 1, 1],
        '5' => [7, 4, 7, 1, 7],
        '6' => [7, 4, 7, 5, 7],
        '7' => [7, 1, 1, 2, 2],
        '8' => [7, 5, 7, 5, 7],
        '9' => [7, 5, 7, 1, 7],
        'a' => [2, 5, 7, 5, 5],
        'b' => [6, 5, 6, 5, 6],
        'c' => [3, 4, 4, 4, 3],
        'd' => [6, 5, 5, 5, 6],
        'e' => [7, 4, 6, 4, 7],
        'f' => [7, 4, 6, 4, 4],
        'g' => [3, 4, 5, 5, 3],
        'h' => [5, 5, 7, 5, 5],
        'i' => [7, 2, 2, 2, 7],
        'j' => [1, 1, 1, 5, 2],
        'k' => [5, 5, 6, 5, 5],
        'l' => [4, 4, 4, 4, 7],
        'm' => [5, 7, 7, 5, 5],
        'n' => [6, 5, 5, 5, 5],
        'o' => [2, 5, 5, 5, 2],
        'p' => [6, 5, 6, 4, 4],
        'q' => [2, 5, 5, 6, 3],
        'r' => [6, 5, 6, 5, 5],
        's' => [3, 4, 2, 1, 6],
        't' => [7, 2, 2, 2, 2],
        'u' => [5, 5, 5, 5, 7],
        'v' => [5, 5, 5, 5, 2],
        'w' => [5, 5, 7, 7, 5],
        'x' => [5, 5, 2, 5, 5],
        'y' => [5, 5, 2, 2, 2],
        'z' => [7, 1, 2, 4, 7],
        '.' => [0, 0, 0, 0, 2],
        ',' => [0, 0, 0, 2, 4],
        '-' => [0, 0, 7, 0, 0],
        '+' => [0, 2, 7, 2, 0],
        '_' => [0, 0, 0, 0, 7],
        '=' => [0, 7, 0, 7, 0],
        ':' => [0, 2, 0, 2, 0],
        '%' => [5, 1, 2, 4, 5],
        '(' => [1, 2, 2, 2, 1],
        ')' => [4, 2, 2, 2, 4],
        '\'' => [2, 2, 0, 0, 0],
        ' ' => [0; 5],
        _ => [7, 7, 7, 7, 7],
    }
}

impl Raster {
    fn put(&mut self, x: i64, y: i64, c: Rgb) {
        if x >= 0 && y >= 0 && (x as usize) < self.w && (y as usize) < self.h {
            let i = (y as usize * self.w + x as usize) * 3;
            self.px[i..i + 3].copy_from_slice(&c);
        }
    }
}

impl Canvas for Raster {
    fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, c: Rgb) {
        for yy in y.round() as i64..(y + h).round() as i64 {
            for xx in x.round() as i64..(x + w).round() as i64 {
                self.put(xx, yy, c);
            }
        }
    }
    fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, c: Rgb) {
        let steps = ((x2 - x1).abs().max((y2 - y1).abs()).ceil() as i64).max(1);
        for s in 0..=steps {
            let t = s as f64 / steps as f64;
            self.put((x1 + (x2 - x1) * t).round() as i64, (y1 + (y2 - y1) * t).round() as i64, c);
        }
    }
    fn text(&mut self, x: f64, y: f64, s: &str, centred: bool) {
        const SCALE: i64 = 2;
        let adv = 4 * SCALE;
        let width = s.chars().count() as i64 * adv;
        let x0 = if centred { x.round() as i64 - width / 2 } else { x.round() as i64 };
        let y0 = y.round() as i64 - 5 * SCALE;
        for (k, ch) in s.chars().enumerate() {
            for (row, bits) in glyph(ch).iter().enumerate() {
                for col in 0..3 {
                    if bits >> (2 - col) & 1 == 1 {
                        for dy in 0..SCALE {
                            for dx in 0..SCALE {
                                self.put(x0 + k as i64 * adv + col * SCALE + dx, y0 + row as i64 * SCALE + dy, INK);
                            }
                        }
                    }
                }
            }
        }
    }
}

fn crc32(data: &[u8]) -> u32 {
    let mut c = 0xffff_ffffu32;
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 == 1 { 0xedb8_8320 ^ (c >> 1) } else { c >> 1 };
        }
    }
    !c
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let mut body = kind.to_vec();
    body.extend_from_slice(data);
    out.extend_from_slice(&body);
    out.extend_from_slice(&crc32(&body).to_be_bytes());
}

/// Encodes an RGB raster as PNG with stored (uncompressed) deflate blocks.
fn png(r: &Raster) -> Vec<u8> {
    let mut raw = Vec::with_capacity((r.w * 3 + 1) * r.h);
    for row in r.px.chunks(r.w * 3) {
        raw.push(0); // filter: none
        raw.extend_from_slice(row);
    }
    let mut z = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = raw.chunks(65_535).collect();
    for (i, b) in blocks.iter().enumerate() {
        z.push((i + 1 == blocks.len()) as u8);
        z.extend_from_slice(&(b.len() as u16).to_le_bytes());
        z.extend_from_slice(&(!(b.len() as u16)).to_le_bytes());
        z.extend_from_slice(b);
    }
    let (mut a, mut b) = (1u32, 0u32);
    for &x in &raw {
        a = (a + x as u32) % 65_521;
        b = (b + a) % 65_521;
    }
    z.extend_from_slice(&((b << 16) | a).to_be_bytes());
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = (r.w as u32).to_be_bytes().to_vec();
    ihdr.extend_from_slice(&(r.h as u32).to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit RGB
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &z);
    chunk(&mut out, b"IEND", &[]);
    out
}

/// Checks that `path` names a chart format (`.svg` or `.png`), before anything is spent.
pub(crate) fn check_path(path: &Path) -> Result<(), DpError> {
    match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("svg" | "png") => Ok(()),
        _ => Err(DpError::Config(format!("--plot {}: use a .svg or .png file name", path.display()))),
    }
}

/// Writes the charts to `path`: `.svg` or `.png` (a new file, unless `force`).
pub(crate) fn write_plot(r: &MarginalRelease, path: &Path, force: bool) -> Result<(), DpError> {
    check_path(path)?;
    let (w, h) = size(r);
    let bytes = match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("svg") => {
            let mut svg = Svg(format!(
                "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif' font-size='10'>\n<rect width='100%' height='100%' fill='white'/>\n"
            ));
            draw(r, &mut svg);
            svg.0.push_str("</svg>\n");
            svg.0.into_bytes()
        }
        Some("png") => {
            let (wi, hi) = (w as usize, h as usize);
            let mut raster = Raster { w: wi, h: hi, px: vec![255; wi * hi * 3] };
            draw(r, &mut raster);
            png(&raster)
        }
        _ => return Err(DpError::Config(format!("--plot {}: use a .svg or .png file name", path.display()))),
    };
    use std::io::Write;
    super::marginals::create(path, force)?
        .write_all(&bytes)
        .map_err(|source| DpError::Io { path: path.display().to_string(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_and_png_structure() {
        assert_eq!(crc32(b"IEND"), 0xae42_6082);
        let r = Raster { w: 2, h: 1, px: vec![255, 0, 0, 0, 0, 255] };
        let p = png(&r);
        assert_eq!(&p[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&p[p.len() - 8..p.len() - 4], b"IEND");
    }
}
