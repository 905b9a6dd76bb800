//! # dpfusion-charts
//!
//! Bar charts of released numbers, each bar with its confidence interval as an error bar, as SVG or PNG: a query's
//! [`Release`] ([`Chart::of_release`]) or a [`MarginalRelease`] ([`Chart::of_marginals`]), then
//! [`Chart::render`]. The `dpfusion` command (`--plot`) and the Python package (`Release.chart()`) draw with it;
//! the engine does not depend on it (nor on plotters).
//!
//! # Privacy
//! A chart is drawn from what was released and nothing else: the noisy values, their intervals, the public keys,
//! σ and ρ. It is post-processing (BS16 Lemma 1.8) and costs nothing. Because the labels are the public
//! keys of the release, a chart has exactly as many bars as the release has rows.
//!
//! # Drawing
//! [`plotters`] draws both formats from the same code. The PNG's text is set in DejaVu Sans, bundled in the binary
//! (`crates/charts/assets/fonts`, Bitstream Vera licence), so nothing depends on the fonts of the machine; an SVG names the
//! family `sans-serif` and leaves the glyphs to the viewer. Each panel has a y axis with ticks and values, its
//! category labels under the bars (rotated when they do not fit side by side, thinned when even rotated they do
//! not), and a title; the figure has a caption with σ, ρ and the confidence level.

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float64Type, Schema};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use dpfusion::error::{DpError, Result};
use dpfusion::format::fmt_num;
use dpfusion::marginals::MarginalRelease;
use dpfusion::release::{Accuracy, Release};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{FontStyle, FontTransform};
use std::path::Path;
use std::sync::OnceLock;

/// DejaVu Sans (Bitstream Vera licence, `crates/charts/assets/fonts/LICENSE-DejaVu.txt`).
const FONT: &[u8] = include_bytes!("../assets/fonts/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";
const BAR: RGBColor = RGBColor(0x4c, 0x78, 0xa8);
const ERR: RGBColor = RGBColor(0xd6, 0x27, 0x28);
const INK: RGBColor = RGBColor(0x33, 0x33, 0x33);

/// At most this many panels are drawn (a marginal release of more columns shows the first ones and says so).
pub const MAX_PANELS: usize = 120;
/// Labels longer than this many characters are shortened with `…`.
const LABEL_CHARS: usize = 18;
const PANEL_H: u32 = 290;
/// Height of a line of the figure's title; the title starts this far from the top.
const TITLE_LINE: u32 = 24;
const LINE_H: u32 = 18;
/// Text sizes as plotters counts them (1.24 × the pixel height of the glyphs).
const LABEL_SIZE: f64 = 13.0;
const TITLE_SIZE: f64 = 19.0;
const CAPTION_SIZE: f64 = 14.0;

/// A chart file format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChartFormat {
    /// Scalable vector graphics.
    Svg,
    /// A PNG raster.
    Png,
}

impl ChartFormat {
    /// The format a file name asks for: `.svg` or `.png` (any case).
    pub fn of_path(path: &Path) -> Result<ChartFormat> {
        match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
            Some("svg") => Ok(ChartFormat::Svg),
            Some("png") => Ok(ChartFormat::Png),
            _ => Err(DpError::InvalidParameter {
                name: "plot",
                reason: format!("{}: use a file name ending in .svg or .png", path.display()),
            }),
        }
    }
}

/// One bar: its label, the released value (none for a NULL) and the interval drawn as its error bar.
#[derive(Clone, Debug, PartialEq)]
pub struct Bar {
    /// The category (a public key).
    pub label: String,
    /// The released value.
    pub value: Option<f64>,
    /// `[low, high]` at the chart's confidence level, when one can be stated.
    pub interval: Option<[f64; 2]>,
}

/// One panel: a title over its bars.
#[derive(Clone, Debug, PartialEq)]
pub struct Panel {
    /// Usually the column's name.
    pub title: String,
    /// The bars, left to right.
    pub bars: Vec<Bar>,
}

/// A figure: a title, panels in a grid, and a caption (σ, ρ, confidence).
#[derive(Clone, Debug, PartialEq)]
pub struct Chart {
    /// Over the whole figure.
    pub title: String,
    /// The panels, in reading order.
    pub panels: Vec<Panel>,
    /// Under the figure; wrapped to its width.
    pub caption: String,
}

/// Which output columns of a query can be charted: the one public column, whose values label the bars, and the
/// numeric columns that are not public (one panel each). `public[i]` says whether column `i` is public (a GROUP
/// BY key or a constant). Known before the debit (from `EXPLAIN DP`), so `query --plot` refuses for free.
pub fn chart_columns(schema: &Schema, public: &[bool]) -> Result<(usize, Vec<usize>)> {
    let bad = |reason: String| DpError::InvalidParameter { name: "plot", reason };
    let keys: Vec<usize> = (0..schema.fields().len()).filter(|&i| public.get(i).copied().unwrap_or(false)).collect();
    let [key] = keys[..] else {
        let names: Vec<&str> = keys.iter().map(|&i| schema.field(i).name().as_str()).collect();
        return Err(bad(format!(
            "a chart needs exactly one GROUP BY key among the output columns to label its bars; this query has {}. \
             GROUP BY one column, e.g. `SELECT sex, COUNT(*) FROM t GROUP BY sex`",
            if names.is_empty() { "none".to_string() } else { format!("{} ({})", names.len(), names.join(", ")) }
        )));
    };
    let values: Vec<usize> = (0..schema.fields().len())
        .filter(|&i| i != key && !public.get(i).copied().unwrap_or(false))
        .filter(|&i| schema.field(i).data_type().is_numeric())
        .collect();
    if values.is_empty() {
        return Err(bad("a chart needs at least one noisy numeric column (COUNT, SUM, AVG …) to draw".into()));
    }
    Ok((key, values))
}

/// Checks, before anything is spent, that the answer to `sql` can be charted (see [`chart_columns`]): refuses
/// whatever the query itself would refuse, and a query whose output has no single key to label the bars or no
/// noisy number to draw. Reads no data.
pub async fn check_query(session: &dpfusion::DpSession, sql: &str) -> Result<()> {
    let e = session.explain(sql).await?;
    chart_columns(&e.schema, &e.public).map(|_| ())
}

impl Chart {
    /// One panel per column of a marginal release (the first [`MAX_PANELS`]), each cell with its interval
    /// `± ci_half_width` at the release's confidence.
    pub fn of_marginals(r: &MarginalRelease) -> Chart {
        let p = r.plan();
        let panels = r
            .columns()
            .iter()
            .take(MAX_PANELS)
            .map(|c| Panel {
                title: c.column.clone(),
                bars: c
                    .keys
                    .iter()
                    .zip(&c.counts)
                    .map(|(k, &v)| Bar {
                        label: k.clone(),
                        value: Some(v),
                        interval: Some([v - p.ci_half_width, v + p.ci_half_width]),
                    })
                    .collect(),
            })
            .collect();
        let shown = if r.columns().len() > MAX_PANELS {
            format!(" · the first {MAX_PANELS} of {} columns shown", r.columns().len())
        } else {
            String::new()
        };
        Chart {
            title: format!("{}: noisy one-way marginals", r.table()),
            panels,
            caption: format!(
                "error bars: ± {} per cell at {}% confidence · discrete Gaussian σ = {} counts · ρ = {} · \
                 neighbours differ by one privacy unit{}{shown}",
                fmt_num(p.ci_half_width),
                fmt_num(p.confidence * 100.0),
                fmt_num(p.sigma),
                fmt_num(r.charge().rho().get()),
                if r.consistent() { " · consistent: non-negative, equal totals" } else { "" },
            ),
        }
    }

    /// One panel per noisy numeric column of a query's release, one bar per row labelled by its one public
    /// column (see [`chart_columns`]), each with the column's interval.
    pub fn of_release(r: &Release) -> Result<Chart> {
        let schema = r.schema();
        let public: Vec<bool> = r.accuracy().iter().map(|a| a.accuracy == Accuracy::Public).collect();
        let (key, values) = chart_columns(schema, &public)?;
        let engine = |e: datafusion::arrow::error::ArrowError| DpError::Internal(e.to_string());
        let mut labels = Vec::new();
        let mut numbers: Vec<Vec<Option<f64>>> = vec![vec![]; values.len()];
        for b in r.batches() {
            let f = ArrayFormatter::try_new(b.column(key).as_ref(), &FormatOptions::default().with_null("NULL"))
                .map_err(engine)?;
            labels.extend((0..b.num_rows()).map(|i| f.value(i).to_string()));
            for (out, &c) in numbers.iter_mut().zip(&values) {
                let a = cast(b.column(c), &DataType::Float64).map_err(engine)?;
                let a = a.as_primitive::<Float64Type>();
                out.extend((0..a.len()).map(|i| a.is_valid(i).then(|| a.value(i)).filter(|v| v.is_finite())));
            }
        }
        let mut confidence = None;
        let mut sigmas = Vec::new();
        let panels = values
            .iter()
            .zip(numbers)
            .map(|(&c, vals)| {
                let acc =
                    &r.accuracy().get(c).ok_or_else(|| DpError::Internal("a column without accuracy".into()))?.accuracy;
                let name = schema.field(c).name();
                match acc {
                    Accuracy::Noisy { confidence: l, sigma_or_scale, mechanism, .. } => {
                        confidence = Some(*l);
                        let what = match mechanism {
                            dpfusion::noise::Mechanism::Gaussian => "discrete Gaussian σ",
                            dpfusion::noise::Mechanism::Laplace => "discrete Laplace scale",
                            dpfusion::noise::Mechanism::Exponential => "exponential mechanism η",
                        };
                        sigmas.push(format!("{name}: {what} = {}", fmt_num(*sigma_or_scale)));
                    }
                    Accuracy::Combined { confidence: l, .. } | Accuracy::PerRow { confidence: l, .. } => {
                        confidence = Some(*l)
                    }
                    // A rank interval has no error bar on the value axis.
                    Accuracy::Public | Accuracy::NoInterval { .. } | Accuracy::Rank { .. } => {}
                }
                let bars = vals
                    .iter()
                    .zip(&labels)
                    .enumerate()
                    .map(|(row, (&value, label))| Bar {
                        label: label.clone(),
                        value,
                        interval: interval(acc, row, value),
                    })
                    .collect();
                Ok(Panel { title: name.clone(), bars })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut caption = vec![match confidence {
            Some(c) => format!("error bars: {}% intervals of the noise", fmt_num(c * 100.0)),
            None => "no interval can be stated for these columns".to_string(),
        }];
        caption.extend(sigmas);
        caption.push(format!("ρ = {}", fmt_num(r.charge().rho().get())));
        caption.push("neighbours differ by one privacy unit".into());
        Ok(Chart { title: r.sql().to_string(), panels, caption: caption.join(" · ") })
    }

    /// Draws the chart.
    pub fn render(&self, format: ChartFormat) -> Result<Vec<u8>> {
        register_font()?;
        let layout = Layout::of(self);
        let failed = |e: String| DpError::Internal(format!("drawing the chart failed: {e}"));
        match format {
            ChartFormat::Svg => {
                let mut s = String::new();
                draw(SVGBackend::with_string(&mut s, (layout.width, layout.height)).into_drawing_area(), self, &layout)
                    .map_err(failed)?;
                Ok(s.into_bytes())
            }
            ChartFormat::Png => {
                let (w, h) = (layout.width, layout.height);
                let mut px = vec![255u8; w as usize * h as usize * 3];
                draw(BitMapBackend::with_buffer(&mut px, (w, h)).into_drawing_area(), self, &layout).map_err(failed)?;
                let mut out = Vec::new();
                let mut enc = png::Encoder::new(&mut out, w, h);
                enc.set_color(png::ColorType::Rgb);
                enc.set_depth(png::BitDepth::Eight);
                let mut writer = enc.write_header().map_err(|e| failed(e.to_string()))?;
                writer.write_image_data(&px).map_err(|e| failed(e.to_string()))?;
                writer.finish().map_err(|e| failed(e.to_string()))?;
                Ok(out)
            }
        }
    }
}

/// The interval of row `row` of a column with accuracy `acc`, around its released `value`.
fn interval(acc: &Accuracy, row: usize, value: Option<f64>) -> Option<[f64; 2]> {
    let v = value?;
    match acc {
        Accuracy::Noisy { ci_half_width: h, .. } | Accuracy::Combined { ci_half_width: h, .. } => Some([v - h, v + h]),
        Accuracy::PerRow { intervals, .. } => {
            intervals.get(row).copied().filter(|[lo, hi]| lo.is_finite() && hi.is_finite())
        }
        Accuracy::Public | Accuracy::NoInterval { .. } | Accuracy::Rank { .. } => None,
    }
}

fn register_font() -> Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    if *REGISTERED.get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok()) {
        Ok(())
    } else {
        Err(DpError::Internal("the bundled chart font cannot be read".into()))
    }
}

/// The width of `s` in pixels at `size`, with the bundled font.
fn text_width(s: &str, size: f64) -> u32 {
    (FAMILY, size).into_font().box_size(s).map_or(s.chars().count() as u32 * size as u32 * 6 / 10, |(w, _)| w)
}

fn shorten(s: &str) -> String {
    if s.chars().count() <= LABEL_CHARS {
        s.to_string()
    } else {
        s.chars().take(LABEL_CHARS - 1).chain(['…']).collect()
    }
}

/// Sizes of the figure.
struct Layout {
    width: u32,
    height: u32,
    panel_w: u32,
    per_row: usize,
    title: Vec<String>,
    caption: Vec<String>,
}

impl Layout {
    fn of(c: &Chart) -> Layout {
        let most = c.panels.iter().map(|p| p.bars.len()).max().unwrap_or(1).max(1) as u32;
        let panel_w = (90 + 22 * most).clamp(360, 1500);
        let per_row = ((1500 / panel_w) as usize).clamp(1, 4).min(c.panels.len().max(1));
        let width = panel_w * per_row as u32;
        let rows = c.panels.len().div_ceil(per_row).max(1) as u32;
        let caption = wrap(&c.caption, width.saturating_sub(20), CAPTION_SIZE);
        let mut title = wrap(&c.title, width.saturating_sub(20), TITLE_SIZE);
        if title.len() > 3 {
            title.truncate(3);
            title[2].push('…');
        }
        let height = TITLE_LINE * (title.len() as u32 + 1) + rows * PANEL_H + 10 + LINE_H * caption.len() as u32;
        Layout { width, height, panel_w, per_row, title, caption }
    }
}

/// Breaks `text` at spaces into lines at most `width` pixels wide (a longer word stays whole on its own line).
fn wrap(text: &str, width: u32, size: f64) -> Vec<String> {
    let mut lines: Vec<String> = vec![];
    for word in text.split(' ') {
        match lines.last_mut() {
            Some(l) if text_width(&format!("{l} {word}"), size) <= width => {
                l.push(' ');
                l.push_str(word)
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

type Drawn = std::result::Result<(), String>;

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, c: &Chart, l: &Layout) -> Drawn {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    for (i, line) in l.title.iter().enumerate() {
        let y = 10 + (i as u32 * TITLE_LINE) as i32;
        root.draw(&Text::new(line.clone(), (10, y), (FAMILY, TITLE_SIZE).into_font().color(&INK))).map_err(e)?;
    }
    let rows = c.panels.len().div_ceil(l.per_row).max(1);
    let grid = root.margin(TITLE_LINE * (l.title.len() as u32 + 1), 0, 0, 0);
    let (grid, foot) = grid.split_vertically(rows as u32 * PANEL_H);
    for (p, area) in c.panels.iter().zip(grid.split_evenly((rows, l.per_row))) {
        draw_panel(&area, p, l.panel_w)?;
    }
    for (i, line) in l.caption.iter().enumerate() {
        let y = 6 + i as i32 * LINE_H as i32;
        foot.draw(&Text::new(line.clone(), (10, y), (FAMILY, CAPTION_SIZE).into_font().color(&INK))).map_err(e)?;
    }
    root.present().map_err(e)
}

/// A y-axis tick value: integers as such, others with at most three decimals.
fn tick(y: f64) -> String {
    if (y - y.round()).abs() < 1e-9 { format!("{:.0}", y.round()) } else { fmt_num((y * 1000.0).round() / 1000.0) }
}

fn draw_panel<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, p: &Panel, panel_w: u32) -> Drawn {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let n = p.bars.len();
    let ends = p.bars.iter().flat_map(|b| b.value.into_iter().chain(b.interval.into_iter().flatten()));
    let (lo, hi) = ends.fold((0.0f64, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let pad = if hi > lo { (hi - lo) * 0.05 } else { 1.0 };
    let (lo, hi) = (if lo < 0.0 { lo - pad } else { 0.0 }, hi + pad);
    let labels: Vec<String> = p.bars.iter().map(|b| shorten(&b.label)).collect();
    let widest = labels.iter().map(|s| text_width(s, LABEL_SIZE)).max().unwrap_or(0);
    let y_area = [lo, hi].iter().map(|&v| text_width(&tick(v), LABEL_SIZE)).max().unwrap_or(0) + 16;
    let plot_w = panel_w.saturating_sub(y_area + 20).max(40);
    let slot = plot_w / n.max(1) as u32;
    // Side by side when they fit; otherwise rotated; and thinned when even rotated they would overlap.
    let rotate = widest + 6 > slot;
    let x_area = if rotate { widest.min(110) + 14 } else { 24 };
    let room = if rotate { plot_w / 14 } else { plot_w / (widest + 6).max(1) };
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, (FAMILY, 16).into_font().color(&INK))
        .margin(8)
        .margin_right(14)
        .x_label_area_size(x_area)
        .y_label_area_size(y_area)
        .build_cartesian_2d((0..n.max(1) as i32 - 1).into_segmented(), lo..hi)
        .map_err(e)?;
    let style = (FAMILY, LABEL_SIZE).into_font().color(&INK);
    let y_tick = |y: &f64| tick(*y);
    let no_label = |_: &SegmentValue<i32>| String::new();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE)
        .bold_line_style(RGBColor(0xe4, 0xe4, 0xe4))
        .x_labels(n.max(1))
        .x_label_formatter(&no_label)
        .y_labels(6)
        .y_label_formatter(&y_tick)
        .y_label_style(style.clone())
        .axis_style(INK)
        .draw()
        .map_err(e)?;
    // The category labels, drawn here rather than by the mesh (which centres rotated text on its tick): every
    // `step`-th one, starting under its bar's centre, reading downwards when rotated.
    let step = n.div_ceil(room.max(1) as usize).max(1);
    let (bx, by) = area.get_base_pixel();
    let label_style = if rotate {
        style.transform(FontTransform::Rotate90).pos(Pos::new(HPos::Left, VPos::Center))
    } else {
        style.pos(Pos::new(HPos::Center, VPos::Top))
    };
    for (i, text) in labels.iter().enumerate().step_by(step) {
        let (x, y) = chart.backend_coord(&(SegmentValue::CenterOf(i as i32), lo));
        area.draw(&Text::new(text.clone(), (x - bx, y - by + 7), label_style.clone())).map_err(e)?;
    }
    let gap = (slot / 8).min(12);
    chart
        .draw_series(p.bars.iter().enumerate().filter_map(|(i, b)| {
            let v = b.value?;
            let i = i as i32;
            let mut r = Rectangle::new([(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), v)], BAR.filled());
            r.set_margin(0, 0, gap, gap);
            Some(r)
        }))
        .map_err(e)?;
    // Each error bar: a vertical line from low to high and a cap at each end (three paths).
    let cap = (slot / 5).clamp(1, 8) as i32;
    for (i, b) in p.bars.iter().enumerate() {
        let Some([low, high]) = b.interval else { continue };
        let x = || SegmentValue::CenterOf(i as i32);
        chart.draw_series([PathElement::new(vec![(x(), low), (x(), high)], ERR.stroke_width(1))]).map_err(e)?;
        for y in [low, high] {
            let c = EmptyElement::at((x(), y)) + PathElement::new(vec![(-cap, 0), (cap, 0)], ERR.stroke_width(1));
            chart.draw_series([c]).map_err(e)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(bars: usize, panels: usize) -> Chart {
        let panels = (0..panels)
            .map(|p| Panel {
                title: format!("column {p}"),
                bars: (0..bars)
                    .map(|i| Bar {
                        label: format!("category {i}"),
                        value: Some(100.0 + i as f64),
                        interval: Some([90.0 + i as f64, 110.0 + i as f64]),
                    })
                    .collect(),
            })
            .collect();
        Chart { title: "t".into(), panels, caption: "σ = 1 · ρ = 0.1 · 95% confidence".into() }
    }

    fn attr<'a>(element: &'a str, name: &str) -> Option<&'a str> {
        let at = element.find(&format!(" {name}=\""))? + name.len() + 3;
        element[at..].split('"').next()
    }

    /// Counts SVG elements `<tag …>` whose fill or stroke is `color`.
    fn count(svg: &str, tag: &str, color: RGBColor) -> usize {
        let hex = format!("#{:02X}{:02X}{:02X}", color.0, color.1, color.2);
        svg.split(&format!("<{tag} "))
            .skip(1)
            .filter(|e| {
                let e = e.split('>').next().unwrap_or("");
                [attr(e, "fill"), attr(e, "stroke")].iter().any(|a| a.is_some_and(|a| a.eq_ignore_ascii_case(&hex)))
            })
            .count()
    }

    #[test]
    fn svg_has_one_bar_and_one_error_bar_per_cell() {
        let svg = String::from_utf8(chart(16, 2).render(ChartFormat::Svg).unwrap()).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(count(&svg, "rect", BAR), 32);
        assert_eq!(count(&svg, "polyline", ERR), 32 * 3, "a line and two caps per bar");
        let texts: Vec<&str> = svg
            .split("<text")
            .skip(1)
            .filter_map(|t| t.split_once('>').and_then(|(_, t)| t.split("</text>").next()).map(str::trim))
            .collect();
        for i in 0..16 {
            assert_eq!(texts.iter().filter(|t| **t == format!("category {i}")).count(), 2, "label {i} in each panel");
        }
        assert!(texts.contains(&"column 1") && texts.contains(&"σ = 1 · ρ = 0.1 · 95% confidence"), "{texts:?}");
    }

    #[test]
    fn many_categories_are_thinned_but_every_bar_is_drawn() {
        let svg = String::from_utf8(chart(200, 1).render(ChartFormat::Svg).unwrap()).unwrap();
        assert_eq!(count(&svg, "rect", BAR), 200);
        let labels = svg.matches("category ").count();
        assert!((10..200).contains(&labels), "{labels} labels for 200 bars");
    }

    #[test]
    fn png_decodes_with_the_bars_and_error_bars() {
        let png = chart(16, 1).render(ChartFormat::Png).unwrap();
        let mut r = png::Decoder::new(std::io::Cursor::new(png)).read_info().unwrap();
        let mut px = vec![0; r.output_buffer_size().unwrap()];
        let info = r.next_frame(&mut px).unwrap();
        let (w, h) = (info.width as usize, info.height as usize);
        let runs = |y: usize, c: RGBColor| {
            let row = &px[y * w * 3..(y + 1) * w * 3];
            let hit: Vec<bool> = row.chunks(3).map(|p| p == [c.0, c.1, c.2]).collect();
            hit.windows(2).filter(|w| w[1] && !w[0]).count() + usize::from(hit[0])
        };
        // Just above the baseline: 16 bars and no error bar; through the caps or the whiskers: 16 error bars.
        assert!((0..h).any(|y| runs(y, BAR) == 16 && runs(y, ERR) == 0), "16 bars");
        assert!((0..h).any(|y| runs(y, ERR) == 16), "16 error bars");
    }

    #[test]
    fn a_query_needs_one_key_and_a_noisy_number() {
        use datafusion::arrow::datatypes::Field;
        let s = Schema::new(vec![
            Field::new("sex", DataType::Utf8, false),
            Field::new("n", DataType::Int64, true),
            Field::new("note", DataType::Utf8, true),
        ]);
        assert_eq!(chart_columns(&s, &[true, false, false]).unwrap(), (0, vec![1]));
        let e = chart_columns(&s, &[false, false, false]).unwrap_err().to_string();
        assert!(e.contains("exactly one GROUP BY key") && e.contains("none"), "{e}");
        let e = chart_columns(&s, &[true, true, false]).unwrap_err().to_string();
        assert!(e.contains("has 2 (sex, n)"), "{e}");
        let s = Schema::new(vec![s.field(0).clone(), s.field(2).clone()]);
        assert!(chart_columns(&s, &[true, false]).unwrap_err().to_string().contains("noisy numeric"));
    }

    #[test]
    fn file_names_choose_the_format() {
        assert_eq!(ChartFormat::of_path(Path::new("a.SVG")).unwrap(), ChartFormat::Svg);
        assert_eq!(ChartFormat::of_path(Path::new("a.png")).unwrap(), ChartFormat::Png);
        assert!(ChartFormat::of_path(Path::new("a.pdf")).unwrap_err().to_string().contains(".svg or .png"));
    }
}
