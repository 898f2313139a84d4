//! The plot: validation loss against virtual time, one curve per run.

use std::fmt::Write as _;
use std::time::Duration;

use crate::{Cli, Run};

/// Validation loss against virtual time, one curve per crowd (ideal runs dashed), at the
/// first seed (every seed's curves together would be unreadable; the table has their medians).
/// `step`: a tab's step, which the title states (as its share of a core, where `--tab-share`
/// set it).
pub fn svg(runs: &[Run], cli: &Cli, step: Duration) -> String {
    let seed = cli.seeds[0];
    let runs: Vec<&Run> = runs.iter().filter(|r| r.seed == seed).collect();
    let (w, h, pad) = (720.0, 420.0, 50.0);
    let points = runs.iter().flat_map(|r| {
        r.report
            .curve
            .iter()
            .filter_map(|p| Some((p.seconds, p.loss?)))
    });
    let (mut t_max, mut l_min, mut l_max) = (1.0f64, f64::MAX, f64::MIN);
    for (t, l) in points {
        t_max = t_max.max(t);
        l_min = l_min.min(l);
        l_max = l_max.max(l);
    }
    l_min = l_min.min(cli.target_loss) - 0.05;
    l_max = l_max.min(l_min + 3.0);
    let x = |t: f64| pad + t / t_max * (w - 2.0 * pad);
    let y = |l: f64| pad + (l_max - l.min(l_max)) / (l_max - l_min) * (h - 2.0 * pad);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    let _ = writeln!(
        out,
        "<line x1=\"{pad}\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"black\"/><line x1=\"{pad}\" y1=\"{pad}\" x2=\"{pad}\" y2=\"{0}\" stroke=\"black\"/>",
        h - pad,
        w - pad
    );
    let _ = writeln!(
        out,
        "<text x=\"{}\" y=\"{}\">virtual seconds (0-{t_max:.0})</text><text x=\"8\" y=\"{}\">loss</text>",
        w / 2.0 - 60.0,
        h - 12.0,
        pad - 10.0
    );
    for loss in [l_min + 0.05, (l_min + l_max) / 2.0, l_max] {
        let _ = writeln!(
            out,
            "<text x=\"12\" y=\"{:.1}\">{loss:.2}</text>",
            y(loss) + 4.0
        );
    }
    let target = y(cli.target_loss);
    let _ = writeln!(
        out,
        "<line x1=\"{pad}\" y1=\"{target}\" x2=\"{}\" y2=\"{target}\" stroke=\"grey\" stroke-dasharray=\"2,4\"/><text x=\"{}\" y=\"{}\">{}</text>",
        w - pad,
        w - pad + 4.0,
        target + 4.0,
        cli.target_loss
    );
    let colours = [
        "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
    ];
    let sizes: Vec<usize> = cli.workers.clone();
    for r in &runs {
        let i = sizes.iter().position(|&n| n == r.workers).unwrap_or(0);
        let path: Vec<String> = r
            .report
            .curve
            .iter()
            .filter_map(|p| Some(format!("{:.1},{:.1}", x(p.seconds), y(p.loss?))))
            .collect();
        let dash = if r.ideal {
            " stroke-dasharray=\"6,3\""
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "<polyline fill=\"none\" stroke=\"{}\"{dash} points=\"{}\"/>",
            colours[i % colours.len()],
            path.join(" ")
        );
        if !r.ideal {
            let _ = writeln!(
                out,
                "<text x=\"{}\" y=\"{}\" fill=\"{}\">N = {}</text>",
                w - pad - 60.0,
                pad + 14.0 * i as f64,
                colours[i % colours.len()],
                r.workers
            );
        }
    }
    let speed = match cli.tab_step {
        Some(_) => format!("tabs at {:.1} ms a step", step.as_secs_f64() * 1e3),
        None => format!(
            "tabs at {:.0} % of a core ({:.1} ms a step)",
            cli.tab_share * 100.0,
            step.as_secs_f64() * 1e3
        ),
    };
    let _ = writeln!(
        out,
        "<text x=\"{pad}\" y=\"20\">{} behind {}, {speed}, seed {seed}; dashed: ideal data parallelism</text>\n</svg>",
        cli.coordinator,
        cli.link,
    );
    out
}
