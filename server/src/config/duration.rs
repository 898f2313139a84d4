//! Durations as operators write them: `2s`, `500ms`, `1m30s`, or a bare number of seconds
//! (`2`, `0.25`). Units are `humantime`'s (ms, s, m, h, ...); a bare number may have a
//! fraction, which humantime does not take.

use std::time::Duration;

/// Parses a duration; the error says what is accepted.
pub fn parse_duration(raw: &str) -> Result<Duration, String> {
    let raw = raw.trim();
    let parsed = match raw.parse::<f64>() {
        Ok(secs) if (0.0..1e9).contains(&secs) => Ok(Duration::from_secs_f64(secs)),
        Ok(_) => Err(()),
        Err(_) => humantime::parse_duration(raw).map_err(|_| ()),
    };
    parsed.map_err(|()| {
        format!("{raw:?} is not a duration: write seconds (2, 0.5) or a number with a unit (500ms, 2s, 1m)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_units_and_combinations() {
        let ms = Duration::from_millis;
        for (raw, want) in [
            ("2", ms(2000)),
            ("0.25", ms(250)),
            ("2s", ms(2000)),
            ("500ms", ms(500)),
            ("1m30s", ms(90_000)),
            ("1m 30s", ms(90_000)),
            (" 3s ", ms(3000)),
            ("0", ms(0)),
        ] {
            assert_eq!(parse_duration(raw), Ok(want), "{raw}");
        }
    }

    #[test]
    fn garbage_is_refused_with_the_accepted_forms() {
        for raw in ["", "soon", "-1", "2 parsecs", "NaN", "inf", "1e300"] {
            let err = parse_duration(raw).expect_err(raw);
            assert!(err.contains("500ms"), "{err}");
        }
    }
}
