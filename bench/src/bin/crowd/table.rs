//! The Markdown table: one row per crowd size, each figure the median over the seeds (every
//! seed's time to the loss beside it where there are several).

use std::fmt::Write as _;

use crate::{torch, Run};

/// The median of `values`, a run that did not reach the loss (`None`) counted as slower than
/// every one that did: `None` where the middle is such a run. Of an even count, the mean of
/// the middle two.
pub fn median(values: &[Option<f64>]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| match (a, b) {
        (Some(a), Some(b)) => a.total_cmp(b),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    });
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        Some((sorted[mid - 1]? + sorted[mid]?) / 2.0)
    }
}

/// One row per crowd size (a crowd's columns "–" where only the ideal run was made,
/// `--no-crowd`). S(N) and the ideal's are ratios of medians; the busy share, the bytes and
/// the noise scale are medians over the seeds too; the real time is the seeds' sum.
pub fn table(
    runs: &[Run],
    seeds: &[u64],
    tokens_per_sample: f64,
    pytorch: Option<&torch::Torch>,
) -> String {
    let of = |ideal: bool, n: usize| -> Vec<&Run> {
        runs.iter()
            .filter(|r| r.ideal == ideal && r.workers == n)
            .collect()
    };
    let time = |ideal: bool, n: usize| {
        let rs = of(ideal, n);
        (!rs.is_empty()).then(|| median(&rs.iter().map(|r| r.reached).collect::<Vec<_>>()))
    };
    let several = seeds.len() > 1;
    let mut out = format!(
        "| N | time to the loss{} | S(N) | ideal DP: time, S(N) | share of ideal's speedup | speed against PyTorch | busy | bytes per token | noise scale: crowd, ideal DP (samples) | crowd batch | real time |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
        if several {
            format!(" (median; seeds {})", join(seeds))
        } else {
            String::new()
        }
    );
    let torch_time = pytorch.and_then(|t| t.reached);
    let first = runs.iter().map(|r| r.workers).min().unwrap_or(1);
    let mut sizes: Vec<usize> = runs.iter().map(|r| r.workers).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let f =
        |v: Option<f64>, unit: &str| v.map_or("not reached".into(), |v| format!("{v:.2}{unit}"));
    for n in sizes {
        let crowd = of(false, n);
        let reached = time(false, n).flatten();
        let speedup = time(false, first)
            .flatten()
            .zip(reached)
            .map(|(a, b)| a / b);
        let ideal = time(true, n).flatten();
        let ideal_speedup = time(true, first).flatten().zip(ideal).map(|(a, b)| a / b);
        // Of the first size, its own: nothing to say.
        let share = speedup
            .zip(ideal_speedup)
            .filter(|_| n != first)
            .map(|(s, i)| s / i);
        let of_crowd = |column: &dyn Fn(&[&Run]) -> String| {
            if crowd.is_empty() {
                "–".into()
            } else {
                column(&crowd)
            }
        };
        let median_of = |rs: &[&Run], value: &dyn Fn(&Run) -> Option<f64>| {
            let values: Vec<f64> = rs.iter().filter_map(|r| value(r)).collect();
            median(&values.into_iter().map(Some).collect::<Vec<_>>())
        };
        let noise = |rs: &[&Run]| {
            median_of(rs, &|r| r.report.noise_scale?.samples)
                .map_or("–".into(), |s| format!("{s:.0}"))
        };
        let ideal_runs = of(true, n);
        let against = torch_time.zip(reached).map(|(t, c)| t / c);
        let _ = writeln!(
            out,
            "| {n} | {} | {} | {}, {} | {} | {} | {} | {} | {}, {} | {} | {} |",
            of_crowd(&|rs| {
                let each = if several {
                    let times: Vec<String> = rs.iter().map(|r| f(r.reached, "")).collect();
                    format!(" ({})", times.join(", "))
                } else {
                    String::new()
                };
                format!("{}{each}", f(reached, " s"))
            }),
            of_crowd(&|_| f(speedup, "×")),
            if ideal_runs.is_empty() {
                "–".into()
            } else {
                f(ideal, " s")
            },
            if ideal_runs.is_empty() {
                "–".into()
            } else {
                f(ideal_speedup, "×")
            },
            share.map_or("–".into(), |s| format!("{:.0} %", s * 100.0)),
            against.map_or("–".into(), |a| format!("{a:.2}×")),
            of_crowd(&|rs| median_of(rs, &|r| Some(r.report.mean_compute_share))
                .map_or("–".into(), |b| format!("{:.1} %", b * 100.0))),
            of_crowd(
                &|rs| median_of(rs, &|r| Some(r.report.bytes_per_sample / tokens_per_sample))
                    .map_or("–".into(), |b| format!("{b:.0}"))
            ),
            of_crowd(&|rs| noise(rs)),
            if ideal_runs.is_empty() {
                "–".into()
            } else {
                noise(&ideal_runs)
            },
            of_crowd(
                &|rs| median_of(rs, &|r| Some(r.report.noise_scale?.crowd_batch))
                    .map_or("–".into(), |b| format!("{b:.0}"))
            ),
            of_crowd(&|rs| format!("{:.0} s", rs.iter().map(|r| r.real_seconds).sum::<f64>())),
        );
    }
    if let Some(t) = pytorch {
        let _ = writeln!(
            out,
            "\nPyTorch on this machine ({} threads, timed first): {} ({} steps, loss {:.4})",
            t.threads,
            t.reached
                .map_or("not reached".into(), |s| format!("{s:.2} s to the loss")),
            t.steps,
            t.loss
        );
    }
    out
}

fn join(seeds: &[u64]) -> String {
    seeds
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::median;

    /// The middle of an odd count, the mean of the middle two of an even one, and a run that
    /// did not reach the loss slower than every one that did.
    #[test]
    fn the_median_counts_a_run_that_did_not_reach_the_loss_as_the_slowest() {
        assert_eq!(median(&[Some(3.0), Some(1.0), Some(2.0)]), Some(2.0));
        assert_eq!(median(&[Some(4.0), Some(1.0)]), Some(2.5));
        assert_eq!(median(&[None, Some(5.0), Some(1.0)]), Some(5.0));
        assert_eq!(median(&[None, None, Some(1.0)]), None);
        assert_eq!(median(&[Some(1.0), None]), None);
        assert_eq!(median(&[Some(7.0)]), Some(7.0));
        assert_eq!(median(&[]), None);
    }
}
