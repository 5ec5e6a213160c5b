//! SVG charts (plotters' SVG backend) for the HTML report: a fixed palette
//! of clearly different colours, tick labels with units at round values,
//! log-scaled latency axes, and the legend below the plot, off the data.

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// A named series of points.
pub struct Series {
    /// Legend text.
    pub label: String,
    /// Points (x, y).
    pub points: Vec<(f64, f64)>,
}

/// How an axis maps values to positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// From 0, evenly.
    Linear,
    /// Logarithmic (base 10) over the positive data; ticks at 1-2-5 steps
    /// or whole decades. Values ≤ 0 are drawn at the left edge.
    Log,
}

/// What an axis's values are, for its tick labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Whole numbers (`16`), ticks at integers.
    Count,
    /// A rate: `250 tok/s`, `1.5k tok/s` (the text is what is counted).
    PerSecond(&'static str),
    /// Milliseconds, labelled `500 µs`, `20 ms`, `1.5 s`.
    Ms,
    /// A fraction labelled as a percentage.
    Fraction,
}

/// What a chart shows: title and axes.
#[derive(Debug, Clone, Copy)]
pub struct ChartSpec<'a> {
    /// Caption.
    pub title: &'a str,
    /// X axis description.
    pub x_desc: &'a str,
    /// Y axis description.
    pub y_desc: &'a str,
    /// X axis scale (the Y axis is linear).
    pub x_scale: Scale,
    /// X tick label unit.
    pub x_unit: Unit,
    /// Y tick label unit.
    pub y_unit: Unit,
}

/// Series colours: clearly different hues (D3's category10 less its grey,
/// which reads as a grid line); after these, dashed lines in the same order.
pub const PALETTE: [RGBColor; 9] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// The colour and dashing of series `i`: distinct for the first 18.
pub fn series_style(i: usize) -> (RGBColor, bool) {
    (PALETTE[i % PALETTE.len()], (i / PALETTE.len()) % 2 == 1)
}

/// The empirical CDF of `values` as points (value, fraction ≤ value),
/// thinned to at most [`CDF_POINTS`].
pub fn cdf_points(values: &[f64]) -> Vec<(f64, f64)> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    // At most CDF_POINTS points (evenly spaced ranks, always the last): charts stay small.
    let step = n.div_ceil(CDF_POINTS).max(1);
    (0..n)
        .filter(|i| i % step == step - 1 || *i == n - 1)
        .map(|i| (v[i], (i + 1) as f64 / n as f64))
        .collect()
}

/// Most points drawn per CDF.
const CDF_POINTS: usize = 200;

const WIDTH: u32 = 760;
const PLOT_HEIGHT: u32 = 400;
const LEGEND_ROW: u32 = 20;
const LEGEND_MARGIN: u32 = 12;
/// Longest legend text drawn (longer labels are cut with `…`).
const LEGEND_CHARS: usize = 80;

/// One axis: its drawn range and ticks, in drawing space (log10 of the
/// value on a log axis).
#[derive(Debug, Clone, PartialEq)]
struct Axis {
    scale: Scale,
    unit: Unit,
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
    minor: Vec<f64>,
}

impl Axis {
    /// Fits `values` (data coordinates).
    fn fit(scale: Scale, unit: Unit, values: impl Iterator<Item = f64> + Clone) -> Self {
        match scale {
            Scale::Linear => linear_axis(unit, values.filter(|v| v.is_finite()).fold(0f64, f64::max)),
            Scale::Log => log_axis(unit, values.filter(|v| v.is_finite() && *v > 0.0)),
        }
    }

    /// Data → drawing coordinate (clamped into the axis).
    fn to_drawing(&self, v: f64) -> f64 {
        let x = match self.scale {
            Scale::Linear => v,
            Scale::Log if v > 0.0 => v.log10(),
            Scale::Log => self.lo,
        };
        x.clamp(self.lo, self.hi)
    }

    /// The tick label at drawing coordinate `x`.
    fn label(&self, x: f64) -> String {
        let v = if self.scale == Scale::Log { round_significant(10f64.powf(x)) } else { x };
        format_value(v, self.unit)
    }
}

/// `v` to 10 significant digits (10^3 computed as 999.9999… reads 1000).
fn round_significant(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return v;
    }
    let scale = 10f64.powi(9 - v.log10().floor() as i32);
    (v * scale).round() / scale
}

/// A coordinate of plotters' own: linear in drawing space, with exactly
/// our ticks (bold grid lines and labels) and minor lines.
impl Ranged for Axis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let fraction = if self.hi > self.lo { (value - self.lo) / (self.hi - self.lo) } else { 0.5 };
        limit.0 + (f64::from(limit.1 - limit.0) * fraction).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() { self.minor.clone() } else { self.ticks.clone() }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

fn linear_axis(unit: Unit, max: f64) -> Axis {
    let hi = match unit {
        Unit::Fraction => 1.02,
        // Room past the last whole number, so its point isn't on the edge.
        Unit::Count if max > 0.0 => (max * 1.1).max(max + 1.0),
        _ if max > 0.0 => max * 1.05,
        _ => 1.0,
    };
    let (target, min_step) = match unit {
        Unit::Fraction => (5, 0.0),
        Unit::Count => (6, 1.0),
        _ => (6, 0.0),
    };
    Axis { scale: Scale::Linear, unit, lo: 0.0, hi, ticks: nice_ticks(hi, target, min_step), minor: Vec::new() }
}

fn log_axis(unit: Unit, positive: impl Iterator<Item = f64> + Clone) -> Axis {
    let (min, max) = positive.fold((f64::INFINITY, 0f64), |(a, b), v| (a.min(v), b.max(v)));
    let (mut lo, mut hi) = if max > 0.0 { ((min / 1.25).log10(), (max * 1.25).log10()) } else { (0.0, 1.0) };
    if hi - lo < 1.0 {
        let widen = (1.0 - (hi - lo)) / 2.0;
        (lo, hi) = (lo - widen, hi + widen);
    }
    let ticks = log_ticks(lo, hi);
    let minor = decade_multiples(lo, hi, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
    Axis { scale: Scale::Log, unit, lo, hi, ticks, minor }
}

/// Ticks 0, step, 2·step, … ≤ `hi`, at most about `target` of them, the
/// step a 1, 2, 2.5 or 5 times a power of ten (and at least `min_step`).
fn nice_ticks(hi: f64, target: usize, min_step: f64) -> Vec<f64> {
    let raw = hi / target.max(1) as f64;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * magnitude).find(|s| *s >= raw).unwrap_or(raw).max(min_step);
    (0..).map(|k| k as f64 * step).take_while(|t| *t <= hi * (1.0 + 1e-9)).collect()
}

/// Log-axis ticks (log10 values) in [lo, hi]: 1-2-5 steps, or whole
/// decades when those would be more than 8, or 1…9 when fewer than 3.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let ticks = decade_multiples(lo, hi, &[1.0, 2.0, 5.0]);
    if ticks.len() > 8 {
        decade_multiples(lo, hi, &[1.0])
    } else if ticks.len() < 3 {
        decade_multiples(lo, hi, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])
    } else {
        ticks
    }
}

/// log10(m · 10^d) for each multiple `m` and decade `d` that falls in [lo, hi].
fn decade_multiples(lo: f64, hi: f64, multiples: &[f64]) -> Vec<f64> {
    let decades = (lo.floor() as i32)..=(hi.ceil() as i32);
    decades.flat_map(|d| multiples.iter().map(move |m| m.log10() + f64::from(d))).filter(|x| *x >= lo - 1e-9 && *x <= hi + 1e-9).collect()
}

/// A tick label: a round number with its unit.
pub fn format_value(v: f64, unit: Unit) -> String {
    match unit {
        Unit::Count => format_number(v),
        Unit::PerSecond(what) => format!("{} {what}/s", format_number(v)),
        Unit::Fraction => format!("{}%", format_number(v * 100.0)),
        Unit::Ms if v == 0.0 => "0".to_string(),
        Unit::Ms if v >= 1000.0 => format!("{} s", format_number(v / 1000.0)),
        Unit::Ms if v >= 1.0 => format!("{} ms", format_number(v)),
        Unit::Ms => format!("{} µs", format_number(v * 1000.0)),
    }
}

/// `1234.5` → `1.23k`, `2.50` → `2.5`, `3e6` → `3M`: at most three significant decimals.
pub fn format_number(v: f64) -> String {
    let (scaled, suffix) = match v.abs() {
        a if a >= 1e6 => (v / 1e6, "M"),
        a if a >= 1e4 => (v / 1e3, "k"),
        _ => (v, ""),
    };
    let decimals = if scaled.abs() >= 100.0 || scaled == scaled.round() { 0 } else if scaled.abs() >= 10.0 { 1 } else { 2 };
    let text = format!("{scaled:.decimals$}");
    let text = if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.').to_string() } else { text };
    format!("{text}{suffix}")
}

/// Legend layout for `series`: (columns, column width, rows).
fn legend_layout(series: &[Series]) -> (u32, u32, u32) {
    let longest = series.iter().map(|s| s.label.chars().count().min(LEGEND_CHARS)).max().unwrap_or(0) as u32;
    let usable = WIDTH - 2 * LEGEND_MARGIN;
    let column = (longest * 7 + 44).clamp(120, usable);
    let columns = (usable / column).max(1);
    (columns, column, (series.len() as u32).div_ceil(columns))
}

/// A line chart (with point markers when sparse) of `series`, the legend
/// below it; an SVG document.
pub fn line_chart(spec: &ChartSpec, series: &[Series]) -> Result<String, String> {
    let x = Axis::fit(spec.x_scale, spec.x_unit, series.iter().flat_map(|s| s.points.iter().map(|p| p.0)));
    let y = Axis::fit(Scale::Linear, spec.y_unit, series.iter().flat_map(|s| s.points.iter().map(|p| p.1)));
    let (_, _, rows) = legend_layout(series);
    let height = PLOT_HEIGHT + rows * LEGEND_ROW + 2 * LEGEND_MARGIN;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let (plot, legend) = root.split_vertically(PLOT_HEIGHT);
        draw_plot(&plot, spec, &x, &y, series)?;
        draw_legend(&legend, series)?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

fn draw_plot(area: &DrawingArea<SVGBackend, Shift>, spec: &ChartSpec, x: &Axis, y: &Axis, series: &[Series]) -> Result<(), String> {
    let mut chart = ChartBuilder::on(area)
        .caption(spec.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(86)
        .build_cartesian_2d(x.clone(), y.clone())
        .map_err(|e| e.to_string())?;
    let (x_fmt, y_fmt) = (|v: &f64| x.label(*v), |v: &f64| y.label(*v));
    chart
        .configure_mesh()
        .x_desc(spec.x_desc)
        .y_desc(spec.y_desc)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .bold_line_style(RGBColor(215, 215, 215))
        .light_line_style(RGBColor(240, 240, 240))
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, s) in series.iter().enumerate() {
        let (color, dashed) = series_style(i);
        let points: Vec<(f64, f64)> = s.points.iter().map(|&(px, py)| (x.to_drawing(px), py)).collect();
        let style = color.stroke_width(2);
        if dashed {
            chart.draw_series(DashedLineSeries::new(points.clone(), 8, 5, style)).map_err(|e| e.to_string())?;
        } else {
            chart.draw_series(LineSeries::new(points.clone(), style)).map_err(|e| e.to_string())?;
        }
        if points.len() <= 32 {
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Draws one legend entry per series (a line of its style and its label)
/// in rows and columns below the plot.
fn draw_legend(area: &DrawingArea<SVGBackend, Shift>, series: &[Series]) -> Result<(), String> {
    let (columns, column, _) = legend_layout(series);
    let font = ("sans-serif", 13).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center));
    for (i, s) in series.iter().enumerate() {
        let (color, dashed) = series_style(i);
        let (col, row) = (i as u32 % columns, i as u32 / columns);
        let x = (LEGEND_MARGIN + col * column) as i32;
        let y = (LEGEND_MARGIN + row * LEGEND_ROW + LEGEND_ROW / 2) as i32;
        let segments: &[(i32, i32)] = if dashed { &[(0, 8), (13, 21), (26, 30)] } else { &[(0, 30)] };
        for &(a, b) in segments {
            area.draw(&PathElement::new(vec![(x + a, y), (x + b, y)], color.stroke_width(3))).map_err(|e| e.to_string())?;
        }
        area.draw(&Text::new(legend_text(&s.label), (x + 38, y), font.clone())).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn legend_text(label: &str) -> String {
    if label.chars().count() <= LEGEND_CHARS {
        return label.to_string();
    }
    let cut: String = label.chars().take(LEGEND_CHARS - 1).collect();
    format!("{cut}…")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn cdf_and_chart_render() {
        assert_eq!(cdf_points(&[3.0, 1.0, f64::NAN, 2.0]), vec![(1.0, 1.0 / 3.0), (2.0, 2.0 / 3.0), (3.0, 1.0)]);
        let many: Vec<f64> = (0..1000).map(f64::from).collect();
        let thin = cdf_points(&many);
        assert_eq!((thin.len(), thin[0], thin[199]), (200, (4.0, 0.005), (999.0, 1.0)));
        let spec = ChartSpec { title: "t", x_desc: "x", y_desc: "y", x_scale: Scale::Linear, x_unit: Unit::Count, y_unit: Unit::Ms };
        let svg = line_chart(&spec, &[Series { label: "run a".into(), points: vec![(1.0, 2.0), (4.0, 3.0)] }]).expect("chart");
        assert!(svg.starts_with("<svg") && svg.contains("run a"), "{svg}");
    }

    #[test]
    fn palette_colours_are_clearly_different() {
        // The "redmean" approximation of perceived colour distance: two
        // shades of one hue (say #1F77B4 and #3C8CC8) are about 70 apart.
        let distance = |a: RGBColor, b: RGBColor| {
            let r = (f64::from(a.0) + f64::from(b.0)) / 2.0;
            let d = |x: u8, y: u8| (f64::from(x) - f64::from(y)).powi(2);
            ((2.0 + r / 256.0) * d(a.0, b.0) + 4.0 * d(a.1, b.1) + (2.0 + (255.0 - r) / 256.0) * d(a.2, b.2)).sqrt()
        };
        assert!(distance(RGBColor(31, 119, 180), RGBColor(60, 140, 200)) < 80.0);
        for (i, a) in PALETTE.iter().enumerate() {
            // No grey (grid lines are grey) ...
            assert!(a.0.max(a.1).max(a.2) - a.0.min(a.1).min(a.2) > 60, "{a:?} is greyish");
            // ... and no two shades of one colour.
            for b in &PALETTE[i + 1..] {
                assert!(distance(*a, *b) > 120.0, "{a:?} and {b:?} are too close");
            }
        }
        let styles: std::collections::HashSet<_> = (0..2 * PALETTE.len()).map(|i| {
            let (c, dashed) = series_style(i);
            (c.0, c.1, c.2, dashed)
        }).collect();
        assert_eq!(styles.len(), 2 * PALETTE.len());
    }

    #[test]
    fn ticks_are_round_with_units_and_log_ticks_span_decades() {
        assert_eq!(nice_ticks(10.5, 6, 0.0), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(nice_ticks(1.05, 6, 1.0), vec![0.0, 1.0]);
        assert_eq!(nice_ticks(1.02, 5, 0.0), vec![0.0, 0.25, 0.5, 0.75, 1.0]);
        let axis = log_axis(Unit::Ms, [1.5, 30.0, 900.0].into_iter());
        let labels: Vec<String> = axis.ticks.iter().map(|t| axis.label(*t)).collect();
        assert_eq!(labels, vec!["10 ms", "100 ms", "1 s"]);
        // Within a decade, 1…9 steps keep at least three labels.
        let axis = log_axis(Unit::Ms, [12.0, 30.0].into_iter());
        assert!(axis.ticks.len() >= 3, "{:?}", axis.ticks);
        assert_eq!(axis.to_drawing(0.0), axis.lo);
        assert_eq!(format_value(0.25, Unit::Ms), "250 µs");
        assert_eq!(format_value(2500.0, Unit::Ms), "2.5 s");
        assert_eq!(format_value(12500.0, Unit::PerSecond("tok")), "12.5k tok/s");
        assert_eq!(format_value(0.75, Unit::Fraction), "75%");
        assert_eq!(format_number(0.30000000000000004), "0.3");
    }
}
