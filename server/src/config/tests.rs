//! Flags parse to the documented defaults, and bad ones are refused by name.

use clap::Parser;

use super::*;
use crate::aggregate::Rule;
use model::OptimizerKind;

fn parse(args: &[&str]) -> Result<Config, String> {
    Config::from_args(std::iter::once("coordinator").chain(args.iter().copied()))
}

#[test]
fn defaults_are_the_documented_ones() {
    let c = parse(&[]).expect("defaults are valid");
    assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", 8080));
    assert_eq!(c.model, ModelChoice::Mlp { hidden: vec![128] });
    assert!(matches!(c.training.optimizer, OptimizerKind::Adam { lr, .. } if lr == 0.001));
    assert_eq!(
        (
            c.training.batch_size,
            c.training.eval_interval,
            c.training.min_workers
        ),
        (32, 10, 1)
    );
    assert_eq!(
        c.training.mode,
        Mode::Sync {
            timeout: RoundTimeout::Auto,
            miss_limit: 3
        }
    );
    assert_eq!(c.liveness.timeout, Duration::from_secs(20));
}

#[test]
fn checkpoint_flags_come_together() {
    // By default a run keeps its model in a directory of its own, and serves it when done.
    let c = parse(&["--checkpoint-every", "7"]).expect("valid");
    assert!(!c.exit_when_finished);
    let kept = c.checkpoints.expect("a run directory");
    let name = kept
        .dir
        .file_name()
        .expect("a name")
        .to_string_lossy()
        .into_owned();
    assert_eq!(kept.dir.parent(), Some(std::path::Path::new("runs")));
    // mlp-YYYYMMDD-HHMMSS
    let stamp = name.strip_prefix("mlp-").expect("the model's name first");
    assert!(
        stamp.len() == 15 && stamp.chars().filter(char::is_ascii_digit).count() == 14,
        "{name}"
    );
    assert_eq!((kept.every, kept.keep, kept.resume), (7, 3, false));
    let gpt = parse(&["--model", "gpt"]).expect("valid").checkpoints;
    assert!(gpt
        .expect("kept")
        .dir
        .to_string_lossy()
        .starts_with("runs/gpt-"));
    let c = parse(&["--no-checkpoints", "--exit-when-finished"]).expect("valid");
    assert_eq!((c.checkpoints, c.exit_when_finished), (None, true));
    let c = parse(&["--checkpoint-dir", "runs/a", "--resume"]).expect("valid");
    let expected = CheckpointConfig {
        dir: "runs/a".into(),
        every: 100,
        keep: 3,
        resume: true,
    };
    assert_eq!(c.checkpoints, Some(expected));
    let cli = Cli::try_parse_from([
        "coordinator",
        "export",
        "--checkpoint-dir",
        "d",
        "--out",
        "m",
    ])
    .expect("the export command");
    assert!(
        matches!(cli.command, Some(Command::Export(ExportArgs { ref out, .. })) if out.as_os_str() == "m")
    );
}

#[test]
fn modes_take_their_own_flags() {
    let c = parse(&["--round-timeout", "500ms", "--miss-limit", "2"]).expect("valid");
    let timeout = RoundTimeout::Fixed(Duration::from_millis(500));
    assert_eq!(
        c.training.mode,
        Mode::Sync {
            timeout,
            miss_limit: 2
        }
    );
    let c = parse(&["--mode", "async", "--buffer", "4", "--max-staleness", "3"]).expect("valid");
    assert_eq!(
        c.training.mode,
        Mode::Async {
            buffer: 4,
            max_staleness: 3
        }
    );
    assert_eq!(
        parse(&["--mode", "hogwild"]).expect("valid").training.mode,
        Mode::Hogwild
    );
}

#[test]
fn durations_are_written_the_way_operators_write_them() {
    for (raw, ms) in [
        ("2s", 2000),
        ("500ms", 500),
        ("2", 2000),
        ("0.25", 250),
        ("1m", 60_000),
    ] {
        let c = parse(&["--round-timeout", raw]).expect(raw);
        let want = RoundTimeout::Fixed(Duration::from_millis(ms));
        assert!(
            matches!(c.training.mode, Mode::Sync { timeout, .. } if timeout == want),
            "{raw}"
        );
    }
    let c = parse(&["--ping-interval", "250ms", "--ping-timeout", "2s"]).expect("valid");
    assert_eq!(c.liveness.interval, Duration::from_millis(250));
    assert_eq!(c.liveness.timeout, Duration::from_secs(2));
}

#[test]
fn flags_are_applied() {
    let c = parse(&[
        "--hidden",
        "64,32",
        "--optimizer",
        "momentum",
        "--momentum",
        "0.5",
        "--lr",
        "0.2",
        "--max-rounds",
        "7",
        "--target-accuracy",
        "0.9",
        "--port",
        "0",
    ])
    .expect("valid");
    assert_eq!(
        c.model,
        ModelChoice::Mlp {
            hidden: vec![64, 32]
        }
    );
    assert_eq!(
        c.training.optimizer,
        OptimizerKind::Momentum {
            lr: 0.2,
            momentum: 0.5
        }
    );
    assert_eq!(
        (c.training.max_rounds, c.training.target_accuracy, c.port),
        (Some(7), Some(0.9), 0)
    );
    let upload = parse(&["--max-upload-rate", "2.5"])
        .expect("valid")
        .upload_rate;
    assert_eq!(upload, Some(2.5e6));
    let rule = |args: &[&str]| parse(args).expect("valid").training.aggregator.rule;
    assert_eq!(
        rule(&["--aggregator", "multi-krum", "--trim", "0.25"]),
        Rule::MultiKrum { hostile: 0.25 }
    );
    assert_eq!(
        rule(&["--aggregator", "centered-clip"]),
        Rule::CenteredClip { radius: None }
    );
    assert_eq!(
        rule(&["--aggregator", "centered-clip", "--clip-radius", "0.5"]),
        Rule::CenteredClip { radius: Some(0.5) }
    );
}

#[test]
fn bad_combinations_are_refused_with_a_clear_message() {
    let cases: &[(&[&str], &str)] = &[
        (&["--hidden", "0"], "--hidden"),
        (&["--resume"], "--resume needs --checkpoint-dir"),
        (
            &["--no-checkpoints", "--checkpoint-dir", "d"],
            "--checkpoint-dir asks for checkpoints, which --no-checkpoints turns off",
        ),
        (
            &["--no-checkpoints", "--checkpoint-every", "5"],
            "--checkpoint-every asks for checkpoints, which --no-checkpoints turns off",
        ),
        (
            &["--no-checkpoints", "--keep-checkpoints", "5"],
            "--keep-checkpoints asks for checkpoints",
        ),
        (
            &["--checkpoint-dir", "d", "--checkpoint-every", "0"],
            "--checkpoint-every",
        ),
        (
            &["--checkpoint-dir", "d", "--keep-checkpoints", "0"],
            "--keep-checkpoints",
        ),
        (&["export", "--out", "m.safetensors"], "--checkpoint-dir"),
        (&["--port", "1", "export"], "cannot be used with"),
        (&["--hidden", "1,2,3,4,5,6,7,8,9"], "at most 8"),
        (&["--lr", "0"], "--lr"),
        (&["--lr", "NaN"], "--lr"),
        (
            &["--momentum", "0.9"],
            "only applies to --optimizer momentum",
        ),
        (&["--optimizer", "momentum", "--momentum", "1.0"], "[0, 1)"),
        (&["--batch-size", "0"], "--batch-size"),
        (&["--batch-size", "70000"], "--batch-size"),
        (
            &["--model", "cnn", "--hidden", "64"],
            "--hidden only applies to --model mlp",
        ),
        (
            &["--model", "resnet"],
            "--model resnet: no such file (and not a preset: use mlp or cnn)",
        ),
        (
            &["--test-fraction", "1"],
            "--test-fraction must be in (0, 1), got 1",
        ),
        (&["--test-fraction", "0"], "--test-fraction"),
        (&["--eval-interval", "0"], "--eval-interval"),
        (&["--max-rounds", "0"], "--max-rounds"),
        (&["--target-accuracy", "1.5"], "--target-accuracy"),
        (&["--min-workers", "0"], "--min-workers"),
        (
            &["--min-workers", "5", "--max-workers", "2"],
            "no round could ever start",
        ),
        (&["--join-token", ""], "--join-token"),
        (&["--log-level", "loud"], "--log-level"),
        (&["--web-dir", "/definitely/not/here"], "--web-dir"),
        (&["--optimizer", "rmsprop"], "invalid value 'rmsprop'"),
        (&["--round-timeout", "soon"], "--round-timeout"),
        (&["--round-timeout", "0"], "--round-timeout"),
        (&["--miss-limit", "0"], "--miss-limit"),
        (&["--buffer", "4"], "only applies to --mode async"),
        (&["--mode", "async", "--buffer", "0"], "--buffer"),
        (
            &["--mode", "async", "--round-timeout", "2"],
            "only applies to --mode sync",
        ),
        (
            &["--mode", "hogwild", "--max-staleness", "2"],
            "only applies to --mode async",
        ),
        (&["--ping-interval", "30"], "--ping-interval"),
        (&["--ping-interval", "soon"], "not a duration"),
        (&["--max-grad-norm", "0"], "--max-grad-norm"),
        (&["--allowed-origin", "evil.example"], "--allowed-origin"),
        (&["--allowed-origin", "ftp://x"], "--allowed-origin"),
        (&["--allowed-origin", "https://x/path"], "--allowed-origin"),
        (&["--max-per-ip", "0"], "--max-per-ip"),
        (&["--verify-fraction", "1.5"], "--verify-fraction"),
        (&["--verify-fraction", "NaN"], "--verify-fraction"),
        (&["--ban-after", "0"], "--ban-after"),
        (&["--trim", "0.5"], "--trim"),
        (&["--aggregator", "median", "--trim", "0.1"], "only applies"),
        (&["--aggregator", "krum"], "invalid value 'krum'"),
        (
            &["--aggregator", "centered-clip", "--trim", "0.1"],
            "only applies",
        ),
        (
            &["--aggregator", "mean", "--clip-radius", "1"],
            "only applies to --aggregator centered-clip",
        ),
        (
            &["--aggregator", "centered-clip", "--clip-radius", "0"],
            "--clip-radius",
        ),
        (&["--aggregator-memory", "0"], "--aggregator-memory"),
        (&["--upload-memory", "0"], "--upload-memory"),
        (&["--upload-memory", "65537"], "--upload-memory"),
        (&["--max-upload-rate", "0"], "--max-upload-rate"),
        (&["--max-upload-rate", "NaN"], "--max-upload-rate"),
        (&["--max-grad-norm", "NaN"], "--max-grad-norm"),
        (&["--max-grad-norm", "1e31"], "--max-grad-norm"),
        (&["--round-timeout", "2 parsecs"], "--round-timeout"),
        (&["--round-timeout", "2h"], "--round-timeout"),
    ];
    for (args, needle) in cases {
        let err = parse(args).expect_err(&format!("{args:?} must be refused"));
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

fn file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    std::io::Write::write_all(&mut f, text.as_bytes()).expect("write");
    f
}

fn layered(args: &[&str], env: &[(&str, &str)]) -> Result<Config, String> {
    let env: std::collections::HashMap<String, String> = env
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    Config::from_layers(
        std::iter::once("coordinator").chain(args.iter().copied()),
        move |k| env.get(k).cloned(),
    )
}

/// Flags over environment over file over defaults, each layer seen winning where it should.
#[test]
fn flags_override_the_environment_which_overrides_the_file() {
    let f = file(
        "max-rounds = 5\neval_interval = 3\nmin-workers = 9\nhidden = [64, 32]\n\
         allowed-origin = [\"https://a.example\", \"https://b.example\"]\nresume = true\n\
         checkpoint-dir = \"runs/x\"\nmax-workers = 50\n",
    );
    let path = f.path().to_str().expect("utf-8");
    let c = layered(
        &["--config", path, "--min-workers", "3"],
        &[
            ("CROWDTRAIN_EVAL_INTERVAL", "4"),
            ("CROWDTRAIN_MIN_WORKERS", "2"),
            ("CROWDTRAIN_BATCH_SIZE", "16"),
        ],
    )
    .expect("valid");
    assert_eq!(c.training.max_rounds, Some(5), "file");
    assert_eq!(c.training.eval_interval, 4, "environment over file");
    assert_eq!(c.training.min_workers, 3, "flag over environment over file");
    assert_eq!(c.training.batch_size, 16, "environment over default");
    assert_eq!(c.training.max_workers, 50, "file over default");
    assert_eq!(
        c.model,
        ModelChoice::Mlp {
            hidden: vec![64, 32]
        },
        "an array"
    );
    let expected = vec!["https://a.example".to_string(), "https://b.example".into()];
    assert_eq!(
        c.allowed_origins,
        crate::edge::admission::Origins::Own(expected)
    );
    assert!(c.checkpoints.expect("from the file").resume, "a switch");
    assert_eq!(c.training.seed, 42, "default");
    // The file named by the environment.
    let c = layered(&[], &[("CROWDTRAIN_CONFIG", path)]).expect("valid");
    assert_eq!(
        (c.training.max_rounds, c.training.min_workers),
        (Some(5), 9)
    );
}

#[test]
fn bad_files_and_values_are_refused_with_the_key_named() {
    for (text, expected) in [
        ("max-roundz = 5\n", "unknown key `max-roundz`"),
        (
            "max-rounds = \"many\"\n",
            "`max-rounds`: invalid value 'many'",
        ),
        ("mode = \"fast\"\n", "`mode`: invalid value 'fast'"),
        ("resume = \"maybe\"\n", "--resume is true or false"),
        ("[section]\nx = 1\n", "unknown key `section`"),
        (
            "seed = 1979-05-27\n",
            "`seed`: expected a string, number, boolean or array",
        ),
        (
            "hidden = [[1]]\n",
            "`hidden`: arrays hold strings, numbers or booleans",
        ),
        ("lr = 50.0\n", "--lr must be a finite number in (0, 10]"),
        ("max-rounds = \n", "--config"),
    ] {
        let f = file(text);
        let err = layered(&["--config", f.path().to_str().expect("utf-8")], &[]).expect_err(text);
        assert!(err.contains(expected), "{text:?}: {err}");
        if !expected.starts_with("--") {
            assert!(
                err.contains(&f.path().display().to_string()),
                "the file is named: {err}"
            );
        }
    }
    let err = layered(&[], &[("CROWDTRAIN_MAX_ROUNDS", "x")]).expect_err("bad env");
    assert!(err.contains("$CROWDTRAIN_MAX_ROUNDS"), "{err}");
    let err = layered(&["--config", "/no/such/file.toml"], &[]).expect_err("missing");
    assert!(err.contains("/no/such/file.toml"), "{err}");
}

/// `--local-steps`: the outer optimizer defaults to DiLoCo's Nesterov (lr 0.7, momentum 0.9)
/// and the inner one to SGD at 0.1; `1` is today's exchange; the flags that only go with
/// local steps, or only with `auto`, are refused elsewhere, by name.
#[test]
fn local_steps_take_their_own_flags() {
    use coordinator_core::{Local, LocalSteps};
    use model::OptimizerKind;
    let c = parse(&["--local-steps", "16"]).expect("valid");
    assert_eq!(
        c.training.local,
        Some(Local {
            steps: LocalSteps::Fixed(16),
            inner: OptimizerKind::Sgd { lr: 0.1 },
            segment: 8,
        })
    );
    assert_eq!(
        c.training.optimizer,
        OptimizerKind::Nesterov {
            lr: 0.7,
            momentum: 0.9
        }
    );
    let c = parse(&[
        "--local-steps",
        "auto",
        "--max-local-steps",
        "500",
        "--inner-optimizer",
        "adam",
        "--inner-lr",
        "0.002",
        "--optimizer",
        "sgd",
        "--lr",
        "1",
    ])
    .expect("valid");
    assert_eq!(
        c.training.local.map(|l| l.steps),
        Some(LocalSteps::Auto {
            min: 16,
            max: 500,
            passes: 1.0
        })
    );
    assert!(matches!(
        c.training.local.map(|l| l.inner),
        Some(OptimizerKind::Adam { lr, .. }) if lr == 0.002
    ));
    assert_eq!(c.training.optimizer, OptimizerKind::Sgd { lr: 1.0 });
    let auto = parse(&["--local-steps", "auto"]).expect("valid");
    assert_eq!(
        auto.training.local.map(|l| l.steps),
        Some(LocalSteps::Auto {
            min: 1,
            max: 4096,
            passes: 1.0
        })
    );
    assert!(auto.training.phases_by_noise);
    let by_link = parse(&["--local-steps", "auto", "--phases-by-noise", "false"]).expect("valid");
    assert!(!by_link.training.phases_by_noise);
    let averaging = parse(&["--local-steps", "8", "--mode", "async"]).expect("valid");
    assert_eq!(averaging.training.optimizer, OptimizerKind::Sgd { lr: 1.0 });
    let one = parse(&["--local-steps", "1"]).expect("valid");
    assert_eq!(one.training.local, None);
    assert_eq!(one.training, parse(&[]).expect("valid").training);
    for (args, says) in [
        (&["--local-steps", "0"][..], "--local-steps must be"),
        (&["--local-steps", "100001"], "--local-steps must be"),
        (&["--local-steps", "many"], "--local-steps must be"),
        (
            &["--local-steps", "16", "--max-local-steps", "64"],
            "only apply to --local-steps auto",
        ),
        (
            &["--local-steps", "auto", "--max-local-steps", "0"],
            "--local-steps must be",
        ),
        (&["--inner-lr", "0.1"], "only apply with --local-steps"),
        (&["--max-local-steps", "8"], "only apply with --local-steps"),
        (
            &["--local-steps", "auto", "--max-local-epochs", "0"],
            "--max-local-epochs must be",
        ),
        (
            &["--local-steps", "8", "--max-local-epochs", "2"],
            "only apply to --local-steps auto",
        ),
        (
            &["--local-steps", "1", "--inner-optimizer", "adam"],
            "--inner-optimizer and --inner-lr do not apply",
        ),
        (
            &["--local-steps", "8", "--inner-lr", "0"],
            "--inner-lr must be",
        ),
        (
            &["--local-steps", "8", "--inner-lr", "NaN"],
            "--inner-lr must be",
        ),
        (
            &["--optimizer", "adam", "--momentum", "0.5"],
            "only applies to --optimizer momentum or nesterov",
        ),
        (
            &["--optimizer", "nesterov", "--momentum", "1"],
            "--momentum must be in [0, 1)",
        ),
    ] {
        let err = parse(args).expect_err(&format!("{args:?} is refused"));
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// A GPT steps as nanoGPT does unless told otherwise: AdamW (β 0.9/0.99, decay 0.1), a
/// warm-up of 100 steps and cosine decay to a tenth by `--max-rounds`, the norm clipped at 1;
/// other models keep Adam with neither.
#[test]
fn a_gpt_steps_as_nanogpt_does() {
    let c = parse(&["--model", "gpt", "--max-rounds", "2000"]).expect("valid");
    assert_eq!(
        c.training.optimizer,
        OptimizerKind::AdamW {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-8,
            weight_decay: 0.1
        }
    );
    let schedule = model::LrSchedule {
        warmup: 100,
        decay_steps: 2000,
        min_lr: 1e-3 / 10.0,
    };
    assert_eq!(
        (c.training.lr_schedule, c.training.clip_norm),
        (Some(schedule), Some(1.0))
    );
    let c = parse(&[
        "--model", "gpt", "--warmup", "0", "--clip", "0.5", "--min-lr", "0",
    ])
    .expect("valid");
    let s = c.training.lr_schedule.expect("a schedule");
    assert_eq!((s.warmup, s.decay_steps, s.min_lr), (0, u64::MAX, 0.0));
    assert_eq!(c.training.clip_norm, Some(0.5));
    let c = parse(&[]).expect("valid");
    assert_eq!((c.training.lr_schedule, c.training.clip_norm), (None, None));
    let c = parse(&[
        "--optimizer",
        "adamw",
        "--weight-decay",
        "0.01",
        "--warmup",
        "5",
    ])
    .expect("an mlp may use them too");
    assert!(
        matches!(c.training.optimizer, OptimizerKind::AdamW { weight_decay, .. } if weight_decay == 0.01)
    );
    assert_eq!(c.training.lr_schedule.map(|s| s.warmup), Some(5));
    // A GPT's phases step with AdamW (DiLoCo's inner optimizer), its decay the flag's; the
    // outer rate holds (no warm-up or decay unless asked, whatever --max-rounds); the clip
    // is the per-step exchange's: no default, the flag refused.
    let c = parse(&[
        "--model",
        "gpt",
        "--local-steps",
        "8",
        "--weight-decay",
        "0.05",
        "--max-rounds",
        "50",
    ])
    .expect("valid");
    assert_eq!((c.training.lr_schedule, c.training.clip_norm), (None, None));
    let inner = c.training.local.expect("local steps").inner;
    assert_eq!(
        inner,
        model::OptimizerKind::AdamW {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-8,
            weight_decay: 0.05
        }
    );
    assert!(
        matches!(c.training.optimizer, OptimizerKind::Nesterov { .. }),
        "DiLoCo's outer"
    );

    for (args, says) in [
        (
            &["--weight-decay", "0.1"][..],
            "--weight-decay only applies to --optimizer adamw",
        ),
        (
            &["--optimizer", "adamw", "--weight-decay", "1.5"],
            "--weight-decay must be in [0, 1)",
        ),
        (
            &["--model", "gpt", "--local-steps", "8", "--clip", "1"],
            "not with --local-steps",
        ),
        (
            &["--warmup", "100", "--max-rounds", "50"],
            "--lr-decay-steps (50) must be above --warmup (100)",
        ),
        (&["--model", "gpt", "--min-lr", "1"], "--min-lr must be"),
        (&["--clip", "0"], "--clip must be"),
        (&["--target-loss", "0"], "--target-loss must be"),
    ] {
        let err = parse(args).expect_err("refused");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// A GPT takes `--local-steps auto` by default when its coordinator listens beyond
/// loopback, and the per-step exchange on loopback, when asked with `--local-steps 1`, or
/// when a flag of that exchange is given; other models keep one step everywhere.
#[test]
fn a_gpt_listening_beyond_loopback_takes_local_phases_by_default() {
    use coordinator_core::LocalSteps;
    use model::OptimizerKind;
    let steps = |args: &[&str]| parse(args).expect("valid").training.local.map(|l| l.steps);
    let auto = Some(LocalSteps::Auto {
        min: 16,
        max: 4096,
        passes: 1.0,
    });
    assert_eq!(steps(&["--model", "gpt"]), None, "127.0.0.1 by default");
    for host in ["localhost", "::1", "[::1]", "127.0.0.1"] {
        assert_eq!(steps(&["--model", "gpt", "--host", host]), None, "{host}");
    }
    for host in ["0.0.0.0", "::", "192.0.2.10", "coordinator.example"] {
        assert_eq!(steps(&["--model", "gpt", "--host", host]), auto, "{host}");
    }
    let remote = parse(&["--model", "gpt", "--host", "0.0.0.0"]).expect("valid");
    assert!(
        matches!(remote.training.local.map(|l| l.inner), Some(OptimizerKind::AdamW { lr, .. }) if lr == 0.001)
    );
    assert!(matches!(
        remote.training.optimizer,
        OptimizerKind::Nesterov { .. }
    ));
    let remote_gpt = ["--model", "gpt", "--host", "0.0.0.0"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> { [&remote_gpt[..], extra].concat() };
    assert_eq!(steps(&with(&["--local-steps", "1"])), None);
    assert_eq!(steps(&with(&["--warmup", "50"])), None);
    assert_eq!(steps(&with(&["--clip", "0.5"])), None);
    assert_eq!(
        steps(&with(&["--max-local-steps", "64"])),
        Some(LocalSteps::Auto {
            min: 16,
            max: 64,
            passes: 1.0
        })
    );
    assert_eq!(
        steps(&with(&["--local-steps", "32"])),
        Some(LocalSteps::Fixed(32))
    );
    assert_eq!(steps(&["--model", "mlp", "--host", "0.0.0.0"]), None);
}

/// The weights' deltas go in int2 for a run of local phases and in int4 for one of single
/// gradients, unless `--delta-encoding` names one; it needs the deltas on.
#[test]
fn deltas_take_int2_with_phases_and_int4_without() {
    use protocol::Compression;
    let deltas = |args: &[&str]| parse(args).expect("valid").training.weight_deltas;
    assert_eq!(deltas(&[]), Some(Compression::Int4));
    assert_eq!(deltas(&["--local-steps", "8"]), Some(Compression::Int2));
    assert_eq!(
        deltas(&["--model", "gpt", "--host", "0.0.0.0"]),
        Some(Compression::Int2),
        "auto phases"
    );
    assert_eq!(
        deltas(&["--local-steps", "8", "--delta-encoding", "int4"]),
        Some(Compression::Int4)
    );
    assert_eq!(
        deltas(&["--delta-encoding", "int2"]),
        Some(Compression::Int2)
    );
    assert_eq!(deltas(&["--weight-deltas", "false"]), None);
    let refused =
        parse(&["--weight-deltas", "false", "--delta-encoding", "int2"]).expect_err("deltas off");
    assert!(
        refused.contains("--delta-encoding only applies"),
        "{refused}"
    );
    assert!(parse(&["--delta-encoding", "int8"]).is_err());
}

#[test]
fn warmup_with_phases_counts_outer_steps_and_then_holds() {
    let schedule = |args: &[&str]| parse(args).expect("valid").training.lr_schedule;
    let gpt_phases = [
        "--model",
        "gpt",
        "--local-steps",
        "auto",
        "--max-rounds",
        "50",
    ];
    assert_eq!(schedule(&gpt_phases), None, "off unless asked");
    let s = schedule(&[&gpt_phases[..], &["--warmup", "4"]].concat()).expect("asked");
    assert_eq!(
        (s.warmup, s.decay_steps),
        (4, u64::MAX),
        "no decay over --max-rounds"
    );
    // The outer rate: 0.7 / 5 on the first round, 0.7 from the fifth on, for good.
    assert!((s.lr_at(0.7, 0) - 0.7 / 5.0).abs() < 1e-7);
    assert_eq!(s.lr_at(0.7, 4), 0.7);
    assert_eq!(s.lr_at(0.7, 1_000_000), 0.7);
    let s = schedule(
        &[
            &gpt_phases[..],
            &["--warmup", "4", "--lr-decay-steps", "100"],
        ]
        .concat(),
    )
    .expect("a schedule");
    assert_eq!((s.warmup, s.decay_steps), (4, 100));
    assert!(
        (s.lr_at(0.7, 100) - 0.07).abs() < 1e-7,
        "down to --min-lr's default"
    );
    assert_eq!(
        schedule(&["--local-steps", "8", "--warmup", "3"]).map(|s| s.warmup),
        Some(3),
        "an MLP's phases too"
    );
    let refused =
        parse(&["--model", "gpt", "--local-steps", "8", "--clip", "1"]).expect_err("clip");
    assert!(
        refused.contains("--clip applies to the coordinator's step"),
        "{refused}"
    );
}
