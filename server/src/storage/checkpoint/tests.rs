use std::path::{Path, PathBuf};

use model::{Network, OptimizerState};

use super::format::{MANIFEST, OPTIMIZER, PARAMS, STATE};
use super::*;

fn fingerprint() -> Fingerprint {
    Fingerprint {
        model: "mlp 4-3-2".into(),
        param_count: 23,
        dataset: "test".into(),
        optimizer: "adam beta1 0.9 beta2 0.999 eps 0.00000001".into(),
        mode: "sync".into(),
    }
}

fn names() -> Vec<String> {
    vec!["m".into(), "v".into()]
}

fn checkpoint(version: u64) -> Checkpoint {
    let values = |k: f32| -> Vec<f32> { (0..23).map(|i| (i as f32 + k) * 0.37 - 2.0).collect() };
    Checkpoint {
        params: values(version as f32),
        optimizer: OptimizerState {
            step: version,
            tensors: vec![
                ("m".into(), values(1.5)),
                ("v".into(), values(0.0).iter().map(|v| v * v).collect()),
            ],
        },
        run: RunState {
            version,
            fingerprint: fingerprint(),
            written_unix_ms: 1_700_000_000_000,
            audit_rng: 0xDEAD_BEEF_0000_0000 + version,
            next_worker: 5,
            identities: vec![("1.00112233445566778899aabbccddeeff".into(), 12)],
            shards: vec![(1, 0, 4000), (2, 4000, 8000)],
            deadline_latencies_ns: vec![1_234_567, 89],
            norm_history: vec![0.1 + 0.2, 1e-300, 3.5],
            counters: Default::default(),
            bans: super::SavedBans {
                workers: vec![3],
                addresses: vec!["203.0.113.7".parse().expect("ip")],
                strikes: vec![(2, 1), (3, 3)],
                address_strikes: vec![],
                trusted: vec![(3, 2)],
            },
            evaluation: Some((version, 0.1 + 0.2, 0.93)),
            tokenizer: None,
        },
    }
}

fn store(dir: &Path, keep: usize) -> Store {
    let mlp = Network::mlp(&[4, 3, 2]).expect("valid");
    Store::new(dir.to_path_buf(), keep, mlp.layout().clone())
}

fn load(store: &Store) -> Result<Loaded, CheckpointError> {
    store.load_newest(&fingerprint(), &names())
}

#[test]
fn a_checkpoint_reads_back_exactly() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = store(dir.path(), 3);
    store.probe().expect("writable");
    let written = store.write(&checkpoint(10)).expect("written");
    assert_eq!(written.path, dir.path().join("ckpt-000000000010"));
    let loaded = load(&store).expect("loads");
    assert_eq!(
        loaded.checkpoint,
        checkpoint(10),
        "every value, f64s included"
    );
    assert!(loaded.skipped.is_empty());
    let mut names: Vec<String> = std::fs::read_dir(&written.path)
        .expect("dir")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .collect();
    names.sort();
    assert_eq!(names, [MANIFEST, OPTIMIZER, PARAMS, STATE]);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(written.path.join(STATE))
            .expect("meta")
            .permissions();
        assert_eq!(mode.mode() & 0o777, 0o600, "resume tokens are secrets");
    }
}

type Damage = fn(&Path);

fn damages() -> [(&'static str, Damage); 3] {
    [
        ("truncated", |p| {
            let bytes = std::fs::read(p).expect("read");
            std::fs::write(p, &bytes[..bytes.len() / 2]).expect("write");
        }),
        ("bit-flipped", |p| {
            let mut bytes = std::fs::read(p).expect("read");
            let at = bytes.len() * 2 / 3;
            bytes[at] ^= 0x10;
            std::fs::write(p, bytes).expect("write");
        }),
        ("deleted", |p| std::fs::remove_file(p).expect("remove")),
    ]
}

/// Every file of the newest checkpoint, truncated, bit-flipped or deleted: the previous
/// checkpoint is used, and the newest is reported with the file at fault.
#[test]
fn a_damaged_newest_checkpoint_falls_back_to_the_previous_one() {
    for file in [PARAMS, OPTIMIZER, STATE, MANIFEST] {
        for (how, damage) in damages() {
            let dir = tempfile::tempdir().expect("temp dir");
            let store = store(dir.path(), 3);
            store.write(&checkpoint(10)).expect("written");
            let newest = store.write(&checkpoint(20)).expect("written").path;
            damage(&newest.join(file));
            let loaded = load(&store).unwrap_or_else(|e| panic!("{file} {how}: {e}"));
            assert_eq!(loaded.checkpoint, checkpoint(10), "{file} {how}");
            assert_eq!(loaded.skipped.len(), 1, "{file} {how}");
            let (path, fault) = &loaded.skipped[0];
            assert_eq!(path, &newest);
            let message = fault.to_string();
            assert!(message.contains(file), "{file} {how}: {message}");
            println!("{file} {how}: {message}");
        }
    }
}

fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    for entry in walk(dir) {
        files.push((entry.clone(), std::fs::read(&entry).expect("read")));
    }
    files.sort();
    files
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[test]
fn with_every_checkpoint_corrupt_nothing_loads_and_nothing_is_touched() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = store(dir.path(), 3);
    for v in [10, 20] {
        let path = store.write(&checkpoint(v)).expect("written").path;
        damages()[1].1(&path.join(PARAMS));
    }
    let before = snapshot(dir.path());
    let err = load(&store).expect_err("none valid");
    let message = err.to_string();
    assert!(message.contains("no valid checkpoint"), "{message}");
    assert!(message.contains("ckpt-000000000020") && message.contains("ckpt-000000000010"));
    assert!(
        message.contains("params.safetensors: checksum mismatch"),
        "{message}"
    );
    assert_eq!(snapshot(dir.path()), before, "not a byte changed");

    let empty = tempfile::tempdir().expect("temp dir");
    let err = load(&self::store(empty.path(), 3)).expect_err("empty");
    assert!(matches!(err, CheckpointError::Empty { .. }), "{err}");
}

#[test]
fn a_checkpoint_of_another_run_is_refused_naming_what_differs() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = store(dir.path(), 3);
    let mut other = checkpoint(10);
    other.run.fingerprint.model = "mlp 4-8-2".into();
    other.run.fingerprint.optimizer = "sgd".into();
    store.write(&other).expect("written");
    let err = load(&store).expect_err("another run");
    let message = err.to_string();
    assert!(
        message.contains("model: checkpoint mlp 4-8-2, now mlp 4-3-2")
            && message.contains("optimizer: checkpoint sgd, now adam"),
        "{message}"
    );
    assert!(!message.contains("mode:"), "only what differs: {message}");
}

#[test]
fn only_the_newest_k_are_kept_and_interrupted_writes_are_cleaned_up() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = store(dir.path(), 3);
    // What a write killed halfway leaves: a temporary directory, never a `ckpt-` one.
    let leftover = dir.path().join(".tmp-ckpt-000000000007-1");
    std::fs::create_dir(&leftover).expect("mkdir");
    std::fs::write(leftover.join(PARAMS), b"half").expect("write");
    assert!(matches!(load(&store), Err(CheckpointError::Empty { .. })));
    for v in 1..=5 {
        store.write(&checkpoint(v * 10)).expect("written");
    }
    let versions: Vec<u64> = store
        .list()
        .expect("list")
        .iter()
        .map(|(v, _)| *v)
        .collect();
    assert_eq!(versions, [50, 40, 30]);
    assert!(!leftover.exists(), "cleaned up after a successful write");
    // The same version written again replaces it.
    let mut again = checkpoint(50);
    again.run.next_worker = 99;
    store.write(&again).expect("written");
    assert_eq!(load(&store).expect("loads").checkpoint.run.next_worker, 99);
    assert_eq!(store.list().expect("list").len(), 3);
}

#[test]
fn the_writer_writes_off_thread_and_reports() {
    let dir = tempfile::tempdir().expect("temp dir");
    let writer = Writer::spawn(store(dir.path(), 2));
    assert!(writer.submit(checkpoint(1)));
    let report = writer.finish(Some(checkpoint(2)));
    assert_eq!((report.written, report.failed), (2, 0), "{report:?}");
    assert_eq!(report.last_version, Some(2));
    assert!(report.last_bytes > 0 && report.last_error.is_none());
    assert_eq!(
        load(&store(dir.path(), 2)).expect("loads").checkpoint,
        checkpoint(2)
    );
}

#[test]
fn export_copies_the_newest_valid_parameters() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = store(dir.path(), 3);
    store.write(&checkpoint(10)).expect("written");
    let newest = store.write(&checkpoint(20)).expect("written").path;
    damages()[0].1(&newest.join(OPTIMIZER));
    let out = dir.path().join("model.safetensors");
    let exported = export(dir.path(), &out, None).expect("exports");
    assert_eq!(exported.version, 10, "the newest intact one");
    let mlp = Network::mlp(&[4, 3, 2]).expect("valid");
    let (params, metadata) = crate::storage::tensors_file::decode_params(
        &std::fs::read(&out).expect("read"),
        mlp.layout(),
    )
    .expect("a safetensors file");
    assert_eq!(params, checkpoint(10).params);
    assert_eq!(metadata["round"], "10");
}

#[test]
fn a_checkpoint_keeps_its_tokenizer_and_reads_it_back() {
    use crate::dataset::{Tokenizer, TokenizerKind};
    let bpe = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/shakespeare-bpe/tokenizer.json");
    let text = "To be, or not to be: that is the question.\n";
    for kind in [
        TokenizerKind::Char,
        TokenizerKind::Byte,
        TokenizerKind::File(bpe),
    ] {
        let run = Tokenizer::fit(&kind, text).expect("fits");
        let dir = tempfile::tempdir().expect("temp dir");
        let store = store(dir.path(), 3);
        let mut written = checkpoint(10);
        written.run.tokenizer = Some(SavedTokenizer::from(&run));
        store.write(&written).expect("written");
        let loaded = load(&store).expect("loads").checkpoint;
        assert_eq!(loaded, written, "{kind:?}");
        let back = loaded.run.tokenizer.expect("kept").tokenizer(dir.path());
        let back = back.expect("rebuilt");
        assert_eq!(back, run, "{kind:?}");
        assert_eq!(back.encode(text), run.encode(text), "{kind:?}");
    }
}

#[test]
fn a_kept_tokenizer_that_was_altered_is_refused_and_an_older_state_has_none() {
    let dir = Path::new("ckpt-000000000010");
    let shuffled = SavedTokenizer::Chars {
        characters: "ba".into(),
    };
    let err = shuffled.tokenizer(dir).unwrap_err();
    assert!(err.contains("not in code point order"), "{err}");
    let bad = SavedTokenizer::File {
        json: "{\"model\": 3}".into(),
    };
    let err = bad.tokenizer(dir).unwrap_err();
    assert!(err.starts_with("ckpt-000000000010: "), "{err}");
    // A state.json written before tokenisers were kept reads as having none.
    let mut state = serde_json::to_value(&checkpoint(10).run).expect("serialises");
    state.as_object_mut().expect("object").remove("tokenizer");
    let older: RunState = serde_json::from_value(state).expect("an older state reads");
    assert_eq!(older.tokenizer, None);
}
