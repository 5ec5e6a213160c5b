//! SVG charts (plotters' SVG backend) for the HTML report.

use plotters::prelude::*;

/// A named series of points.
pub struct Series {
    /// Legend text.
    pub label: String,
    /// Points (x, y).
    pub points: Vec<(f64, f64)>,
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

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

/// A line chart (with point markers) of `series`; an SVG document.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> Result<String, String> {
    let all = series.iter().flat_map(|s| s.points.iter());
    let (mut x_max, mut y_max) = (0f64, 0f64);
    for &(x, y) in all {
        x_max = x_max.max(x);
        y_max = y_max.max(y);
    }
    let (x_max, y_max) = (if x_max > 0.0 { x_max * 1.05 } else { 1.0 }, if y_max > 0.0 { y_max * 1.05 } else { 1.0 });
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (720, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..x_max, 0f64..y_max)
            .map_err(|e| e.to_string())?;
        chart.configure_mesh().x_desc(x_label).y_desc(y_label).draw().map_err(|e| e.to_string())?;
        for (i, s) in series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            chart
                .draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(s.label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            if s.points.len() <= 32 {
                chart
                    .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                    .map_err(|e| e.to_string())?;
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
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
        let svg = line_chart("t", "x", "y", &[Series { label: "run a".into(), points: vec![(1.0, 2.0), (4.0, 3.0)] }])
            .expect("chart");
        assert!(svg.starts_with("<svg") && svg.contains("run a"), "{svg}");
    }
}
