//! Operators' own data and models: a CSV file, an IDX directory and a folder of PNG images,
//! each written here, each trained end to end by native workers over real sockets; spec
//! files in TOML and JSON; bad data and bad specs refused by the real binary.

use std::path::Path;

use model::SplitMix64;
use server::Summary;

use crate::util::*;

const BIN: &str = env!("CARGO_BIN_EXE_coordinator");

/// Three blobs in four features of very different scales (standardisation matters).
fn write_csv(path: &Path, rows: usize) {
    let mut rng = SplitMix64::new(3);
    let mut text = String::from("width,label,height,weight,age\n");
    for i in 0..rows {
        let k = i % 3;
        let noise = |rng: &mut SplitMix64, scale: f64| (rng.next_f64() - 0.5) * scale;
        text.push_str(&format!(
            "{:.3},{},{:.3},{:.1},{:.2}\n",
            k as f64 * 0.8 + noise(&mut rng, 1.0),
            [10, 20, 30][k],
            noise(&mut rng, 5.0),
            2000.0 + k as f64 * 900.0 + noise(&mut rng, 1200.0),
            0.01 * k as f64 + noise(&mut rng, 0.01),
        ));
    }
    std::fs::write(path, text).expect("write csv");
}

/// 16×16 gray images: class k has a bright bar at rows 5k..5k+3, on noise.
fn write_idx(dir: &Path, n: usize) {
    let mut rng = SplitMix64::new(4);
    let mut images = Vec::new();
    for v in [2051u32, n as u32, 16, 16] {
        images.extend_from_slice(&v.to_be_bytes());
    }
    let mut labels = Vec::new();
    labels.extend_from_slice(&2049u32.to_be_bytes());
    labels.extend_from_slice(&(n as u32).to_be_bytes());
    for i in 0..n {
        let k = i % 3;
        for y in 0..16 {
            for _ in 0..16 {
                let bar = (5 * k..5 * k + 3).contains(&y);
                images.push(if bar { 180 } else { 0 } + rng.below(70) as u8);
            }
        }
        labels.push(k as u8);
    }
    std::fs::write(dir.join("train-images-idx3-ubyte"), images).expect("write");
    std::fs::write(dir.join("train-labels-idx1-ubyte"), labels).expect("write");
}

/// `DIR/{red,green,blue}/*.png`, 12×12 RGB, the class's channel brighter, on noise.
fn write_image_folder(dir: &Path, per_class: usize) {
    let mut rng = SplitMix64::new(5);
    for (k, class) in ["red", "green", "blue"].iter().enumerate() {
        std::fs::create_dir_all(dir.join(class)).expect("mkdir");
        for i in 0..per_class {
            let img = image::RgbImage::from_fn(12, 12, |_, _| {
                let mut px = [0u8; 3];
                for (c, p) in px.iter_mut().enumerate() {
                    *p = rng.below(120) as u8 + if c == k { 90 } else { 0 };
                }
                image::Rgb(px)
            });
            img.save(dir.join(class).join(format!("{i:03}.png")))
                .expect("png");
        }
    }
}

/// Trains with two native workers until the target or the round limit.
async fn train(flags: &[&str]) -> (Summary, server::status::Status) {
    let mut all = vec![
        "--min-workers",
        "2",
        "--eval-interval",
        "5",
        "--max-rounds",
        "600",
    ];
    all.extend_from_slice(flags);
    let mut swarm = swarm(&all, 2).await;
    let status = swarm.wait_for("the first round", |s| s.round >= 1).await;
    let (summary, _) = swarm.finish("training").await;
    (summary, status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csv_file_trains_with_a_json_spec() {
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = dir.path().join("people.csv");
    write_csv(&csv, 600);
    let spec = dir.path().join("model.json");
    let json = r#"{"layers": [{"type": "dense", "units": 16}, {"type": "tanh"},
        {"type": "dropout", "p": 0.1}, {"type": "dense"}]}"#;
    std::fs::write(&spec, json).expect("write spec");
    let (summary, status) = train(&[
        "--data",
        csv.to_str().expect("utf-8"),
        "--model",
        spec.to_str().expect("utf-8"),
        "--target-accuracy",
        "0.9",
        "--batch-size",
        "16",
        "--optimizer",
        "adam",
        "--lr",
        "0.01",
    ])
    .await;
    println!("csv: {summary:?}");
    assert!(summary.reached_target, "{summary:?}");
    assert_eq!(
        &*status.model,
        "input 4; dense 16; tanh; dropout 0.1; dense 3"
    );
    assert_eq!(status.param_count, 4 * 16 + 16 + 16 * 3 + 3);
    assert_eq!(*status.classes, ["10", "20", "30"]);
    assert!(
        status
            .dataset
            .contains("480 train / 120 test samples of 4, 3 classes"),
        "{}",
        status.dataset
    );
    assert!(status.model_name.ends_with("model.json"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idx_directory_trains_the_cnn_preset_shaped_to_its_images() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_idx(dir.path(), 300);
    let (summary, status) = train(&[
        "--data",
        dir.path().to_str().expect("utf-8"),
        "--model",
        "cnn",
        "--target-accuracy",
        "0.95",
        "--batch-size",
        "16",
    ])
    .await;
    println!("idx: {summary:?}");
    assert!(summary.reached_target, "{summary:?}");
    assert!(
        status
            .model
            .starts_with("input 1x16x16; conv2d 16 k5 s1 p0;"),
        "{}",
        status.model
    );
    assert!(
        status.model.ends_with("dense 128; relu; dense 3"),
        "{}",
        status.model
    );
    assert_eq!(*status.classes, ["0", "1", "2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_folder_trains_with_a_toml_spec() {
    let dir = tempfile::tempdir().expect("tempdir");
    let images = dir.path().join("images");
    write_image_folder(&images, 40);
    let spec = dir.path().join("model.toml");
    let toml = "[[layers]]\ntype = \"conv2d\"\nfilters = 4\nkernel = 3\npadding = 1\n\
                [[layers]]\ntype = \"relu\"\n[[layers]]\ntype = \"avgpool\"\nsize = 2\n\
                [[layers]]\ntype = \"flatten\"\n[[layers]]\ntype = \"dense\"\n";
    std::fs::write(&spec, toml).expect("write spec");
    let (summary, status) = train(&[
        "--data",
        images.to_str().expect("utf-8"),
        "--model",
        spec.to_str().expect("utf-8"),
        "--target-accuracy",
        "0.95",
        "--batch-size",
        "16",
        "--lr",
        "0.01",
    ])
    .await;
    println!("images: {summary:?}");
    assert!(summary.reached_target, "{summary:?}");
    assert_eq!(
        &*status.model,
        "input 3x12x12; conv2d 4 k3 s1 p1; relu; avgpool 2 s2; flatten; dense 3"
    );
    assert_eq!(*status.classes, ["blue", "green", "red"]);
}

/// Runs the binary, which must exit non-zero at once; returns its stderr, which must be one
/// `error: ...` (a parser's own snippet may follow it) that says each thing once.
async fn refused(args: &[&str]) -> String {
    let run = tokio::process::Command::new(BIN)
        .args(["--port", "0"])
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .kill_on_drop(true)
        .output();
    let out = guard("the coordinator to refuse", run).await.expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "it must not start: {stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    let errors = stderr.lines().filter(|l| l.starts_with("error: ")).count();
    assert_eq!(errors, 1, "said once: {stderr}");
    assert!(!stderr.contains("Caused by"), "{stderr}");
    assert!(!stderr.contains("backtrace"), "{stderr}");
    stderr
}

/// `stderr` says `what`, once.
fn says_once(stderr: &str, what: &str) {
    assert_eq!(
        stderr.matches(what).count(),
        1,
        "{what:?} once in: {stderr}"
    );
}

#[tokio::test]
async fn bad_data_and_bad_specs_are_refused_at_start_with_the_entry_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = dir.path().join("d.csv");
    write_csv(&csv, 30);
    let csv = csv.to_str().expect("utf-8");

    let stderr = refused(&["--data", csv, "--model", "cnn"]).await;
    says_once(&stderr, "layer 0 (conv2d 16 k5 s1 p0) cannot take its input of shape 4: conv2d needs an image input");
    let ragged = dir.path().join("ragged.csv");
    std::fs::write(&ragged, "a,b,label\n1,2,0\n3,4,1\n5,6\n").expect("write");
    let stderr = refused(&["--data", ragged.to_str().expect("utf-8")]).await;
    says_once(
        &stderr,
        "ragged.csv: line 4: 2 fields, but the header has 3",
    );

    let spec = dir.path().join("bad.toml");
    std::fs::write(&spec, "[[layers]]\ntype = \"conv3d\"\n").expect("write");
    let stderr = refused(&["--model", spec.to_str().expect("utf-8")]).await;
    says_once(&stderr, "bad.toml: layer 0 (conv3d): unknown type `conv3d`");
    std::fs::write(
        &spec,
        "[[layers]]\ntype = \"dense\"\nunits = 10\nkernel = 3\n",
    )
    .expect("write");
    let stderr = refused(&["--model", spec.to_str().expect("utf-8")]).await;
    says_once(&stderr, "`kernel` does not apply to dense");
    std::fs::write(&spec, "[[layers]]\ntype = \"dense\"\nunits = 7\n").expect("write");
    let stderr = refused(&["--model", spec.to_str().expect("utf-8")]).await;
    says_once(
        &stderr,
        "the last layer produces 7 values, but the data has 10 classes",
    );
    std::fs::write(&spec, "layers = 3").expect("write");
    let stderr = refused(&["--model", spec.to_str().expect("utf-8")]).await;
    says_once(&stderr, "bad.toml");

    let one_class = dir.path().join("one");
    std::fs::create_dir_all(one_class.join("cats")).expect("mkdir");
    image::GrayImage::new(4, 4)
        .save(one_class.join("cats/a.png"))
        .expect("png");
    let stderr = refused(&["--data", one_class.to_str().expect("utf-8")]).await;
    says_once(&stderr, "only one class (cats)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fine_tuning_the_last_layer_from_a_file_keeps_the_frozen_layer_bit_identical() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A model trained a little, saved from /api/params.
    let mut first = swarm(&["--min-workers", "2"], 2).await;
    first.wait_for("30 rounds", |s| s.round >= 30).await;
    let (code, _, pretrained) = http_get(first.addr(), "/api/params").await;
    assert_eq!(code, 200);
    first.stop().await;
    let init = dir.path().join("pretrained.safetensors");
    std::fs::write(&init, &pretrained).expect("write");
    let spec = dir.path().join("finetune.toml");
    let toml = "[[layers]]\ntype = \"dense\"\nunits = 128\nfreeze = true\n\
                [[layers]]\ntype = \"relu\"\n[[layers]]\ntype = \"dense\"\n";
    std::fs::write(&spec, toml).expect("write spec");

    let flags = [
        "--min-workers",
        "2",
        "--verify-fraction",
        "1",
        "--init",
        init.to_str().expect("utf-8"),
        "--model",
        spec.to_str().expect("utf-8"),
    ];
    let mut tuned = swarm(&flags, 2).await;
    let early = tuned.wait_for("5 rounds", |s| s.round >= 5).await;
    let s = tuned
        .wait_for("20 rounds of fine-tuning", |s| s.round >= 20)
        .await;
    assert_eq!(&*s.model, "input 1x28x28; dense 128 frozen; relu; dense 10");
    // Every gradient recomputed: the workers rebuilt exactly the weights the coordinator
    // meant from `Frozen` (once) and the trained-only `Weights` (int8, each on its own).
    assert!(
        s.counters.gradients_verified >= 38,
        "{}",
        s.counters.gradients_verified
    );
    assert_eq!(s.counters.verification_mismatches, 0);
    // Once the shards and the frozen layer are out, weights carry the last layer only:
    // 1,290 values in int8, not 101,770 (about 103 kB a worker and round). Measured: about
    // 10 kB a round for both workers, a twentieth of the full weights.
    let per_round = (s.counters.bytes_out - early.counters.bytes_out) / (s.round - early.round);
    assert!(
        per_round < 2 * 103_000 / 10,
        "{per_round} bytes out a round"
    );
    let (_, _, after) = http_get(tuned.addr(), "/api/params").await;
    tuned.stop().await;
    let (before, after) = (tensors_by_name(&pretrained), tensors_by_name(&after));
    assert_eq!(
        before["l0.weight"], after["l0.weight"],
        "frozen weight changed"
    );
    assert_eq!(before["l0.bias"], after["l0.bias"], "frozen bias changed");
    assert_ne!(
        before["l1.weight"], after["l1.weight"],
        "the last layer trained"
    );
    assert_ne!(
        before["l1.bias"], after["l1.bias"],
        "the last layer trained"
    );

    // Weights of another shape are refused, naming the tensor.
    let stderr = refused(&["--init", init.to_str().expect("utf-8"), "--hidden", "64"]).await;
    says_once(&stderr, "pretrained.safetensors");
    says_once(&stderr, "l0.weight");
}
