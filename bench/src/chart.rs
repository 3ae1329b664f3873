//! Minimal SVG line charts for the cost curves (no plotting dependency needed).

use std::fmt::Write as _;

/// One panel: a named series of y values over the shared x values.
#[derive(Clone, Debug)]
pub struct Panel {
    pub title: String,
    pub unit: String,
    pub values: Vec<f64>,
}

const PANEL_W: f64 = 320.0;
const PANEL_H: f64 = 220.0;
const MARGIN_L: f64 = 60.0;
const MARGIN_B: f64 = 40.0;
const MARGIN_T: f64 = 30.0;
const MARGIN_R: f64 = 20.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Panels side by side, x on a log2 scale (sizes double), y linear from 0.
pub fn small_multiples(title: &str, x_label: &str, xs: &[f64], panels: &[Panel]) -> String {
    let width = PANEL_W * panels.len() as f64;
    let height = PANEL_H + 30.0;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"10\" y=\"18\" font-size=\"14\" font-weight=\"bold\">{}</text>\n",
        esc(title)
    );
    let x_min = xs
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .max(1e-9)
        .log2();
    let x_max = xs
        .iter()
        .copied()
        .fold(f64::NEG_INFINITY, f64::max)
        .max(1e-9)
        .log2();
    let x_span = (x_max - x_min).max(1e-9);
    for (i, p) in panels.iter().enumerate() {
        let ox = PANEL_W * i as f64;
        let oy = 30.0;
        let plot_w = PANEL_W - MARGIN_L - MARGIN_R;
        let plot_h = PANEL_H - MARGIN_T - MARGIN_B;
        let y_max = p
            .values
            .iter()
            .copied()
            .filter(|v| v.is_finite())
            .fold(0.0, f64::max);
        let y_max = if y_max <= 0.0 { 1.0 } else { y_max * 1.1 };
        let px = |x: f64| ox + MARGIN_L + (x.max(1e-9).log2() - x_min) / x_span * plot_w;
        let py = |y: f64| oy + MARGIN_T + plot_h - y / y_max * plot_h;
        let _ = write!(
            svg,
            "<text x=\"{}\" y=\"{}\" font-weight=\"bold\">{} ({})</text>\n<line x1=\"{x0}\" y1=\"{yb}\" x2=\"{x1}\" y2=\"{yb}\" stroke=\"black\"/>\n<line x1=\"{x0}\" y1=\"{yt}\" x2=\"{x0}\" y2=\"{yb}\" stroke=\"black\"/>\n",
            ox + MARGIN_L,
            oy + 15.0,
            esc(&p.title),
            esc(&p.unit),
            x0 = ox + MARGIN_L,
            x1 = ox + MARGIN_L + plot_w,
            yt = oy + MARGIN_T,
            yb = oy + MARGIN_T + plot_h,
        );
        for k in 0..=4 {
            let y = y_max * f64::from(k) / 4.0;
            let _ = write!(
                svg,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n<line x1=\"{}\" y1=\"{yy}\" x2=\"{}\" y2=\"{yy}\" stroke=\"#ddd\"/>\n",
                ox + MARGIN_L - 4.0,
                py(y) + 4.0,
                fmt_num(y),
                ox + MARGIN_L,
                ox + MARGIN_L + plot_w,
                yy = py(y),
            );
        }
        for &x in xs {
            let _ = writeln!(
                svg,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                px(x),
                oy + MARGIN_T + plot_h + 14.0,
                fmt_num(x)
            );
        }
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            ox + MARGIN_L + plot_w / 2.0,
            oy + MARGIN_T + plot_h + 30.0,
            esc(x_label)
        );
        let points: Vec<String> = xs
            .iter()
            .zip(&p.values)
            .filter(|(_, y)| y.is_finite())
            .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
            .collect();
        let _ = writeln!(
            svg,
            "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"{}\"/>",
            points.join(" ")
        );
        for pt in &points {
            if let Some((x, y)) = pt.split_once(',') {
                let _ = writeln!(
                    svg,
                    "<circle cx=\"{x}\" cy=\"{y}\" r=\"3\" fill=\"#1f77b4\"/>"
                );
            }
        }
    }
    svg.push_str("</svg>\n");
    svg
}

fn fmt_num(v: f64) -> String {
    if v >= 100.0 || v == 0.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_one_polyline_per_panel() {
        let panels = vec![
            Panel {
                title: "CPU".into(),
                unit: "vCPU".into(),
                values: vec![0.1, 0.2, 0.4],
            },
            Panel {
                title: "RSS".into(),
                unit: "MiB".into(),
                values: vec![10.0, f64::NAN, 40.0],
            },
        ];
        let svg = small_multiples(
            "cost <curves>",
            "services",
            &[250.0, 500.0, 1000.0],
            &panels,
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("cost &lt;curves&gt;"));
        assert_eq!(svg.matches("<circle").count(), 5);
    }
}
