//! A full disk and a read-only checkpoint directory, made real with a small tmpfs (mounting
//! needs root, as in CI's containers; elsewhere the tests say so and skip).
//!
//! The policy they check: at start, the coordinator refuses to run (exit non-zero, message
//! naming the directory and the cause); mid-run, training goes on, the failure is logged and
//! shown in `/api/status`, the checkpoints already written stay valid, and checkpoints resume
//! once the disk is writable again.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use server::checkpoint::Store;

use crate::util::*;

const BIN: &str = env!("CARGO_BIN_EXE_coordinator");

/// A tmpfs of `size`, unmounted on drop.
struct Tmpfs {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Tmpfs {
    fn mount(size: &str) -> Option<Self> {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("mnt");
        std::fs::create_dir(&path).expect("mkdir");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .output();
        match mounted {
            Ok(out) if out.status.success() => Some(Self { _dir: dir, path }),
            Ok(out) => {
                println!(
                    "SKIPPED: cannot mount a tmpfs here (needs root): {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
                None
            }
            Err(e) => {
                println!("SKIPPED: no mount command: {e}");
                None
            }
        }
    }

    fn remount(&self, mode: &str) {
        let out = Command::new("mount")
            .args(["-o", &format!("remount,{mode}")])
            .arg(&self.path)
            .output()
            .expect("mount");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Fills every free byte with a file, returning its path.
    fn fill(&self) -> PathBuf {
        let filler = self.path.join("filler");
        let mut file = std::fs::File::create(&filler).expect("create");
        let chunk = vec![0u8; 64 * 1024];
        loop {
            match file.write(&chunk) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        // The last partial block.
        while file.write(&[0u8]).is_ok_and(|n| n == 1) {}
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// The binary with `--checkpoint-dir dir`: it must exit non-zero at once, saying why.
async fn refused_at_start(dir: &Path) -> String {
    let run = tokio::process::Command::new(BIN)
        .args(["--port", "0", "--checkpoint-dir"])
        .arg(dir)
        .kill_on_drop(true)
        .output();
    let out = guard("the coordinator to refuse", run).await.expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "it must not start: {stderr}");
    assert!(
        stderr.contains(&format!("cannot write checkpoints to {}", dir.display())),
        "{stderr}"
    );
    stderr
}

#[tokio::test]
async fn a_read_only_or_full_checkpoint_directory_is_refused_at_start() {
    let Some(fs) = Tmpfs::mount("1m") else { return };
    let dir = fs.path.join("checkpoints");
    fs.remount("ro");
    let stderr = refused_at_start(&dir).await;
    assert!(stderr.contains("Read-only file system"), "{stderr}");
    fs.remount("rw");
    std::fs::create_dir(&dir).expect("mkdir");
    let filler = fs.fill();
    let stderr = refused_at_start(&dir).await;
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert_eq!(
        std::fs::read_dir(&dir).expect("dir").count(),
        0,
        "no probe file left behind"
    );
    std::fs::remove_file(filler).expect("rm");
}

/// Mid-run, the disk fills up and later the directory turns read-only: training goes on, the
/// failures show in the status, earlier checkpoints stay valid, and checkpoints resume once
/// there is room. A full disk at stopping makes the stop report the lost final checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mid_run_disk_faults_cost_checkpoints_not_training() {
    let Some(fs) = Tmpfs::mount("6m") else { return };
    let dir = fs.path.join("checkpoints");
    let server = start_server(&[
        "--checkpoint-dir",
        dir.to_str().expect("utf-8"),
        "--checkpoint-every",
        "2",
        "--keep-checkpoints",
        "2",
    ])
    .await;
    let mut status = server.status.clone();
    let (task, cancel) = spawn_worker(server.addr);
    let report = |s: &server::Status| s.checkpoints.clone().expect("checkpoints on");
    let ok = wait_status(&mut status, "a checkpoint", |s| report(s).written >= 2).await;
    let written = report(&ok).written;

    let filler = fs.fill();
    let full = wait_status(&mut status, "a failed checkpoint", |s| {
        report(s).failed >= 1
    })
    .await;
    let error = report(&full).last_error.clone().expect("why");
    println!("disk full: {error}");
    assert!(error.contains("No space left on device"), "{error}");
    let round = full.round;
    // Training goes on, and the next due checkpoints are tried (and fail) in turn. How many
    // rounds that takes depends on the machine's load: a write can be slower than a round.
    wait_status(&mut status, "training on, and a second failure", |s| {
        s.round >= round + 6 && report(s).failed >= 2
    })
    .await;
    let mlp = model::Network::mlp(&[784, 128, 10]).expect("valid");
    let store = Store::new(dir.clone(), 2, mlp.layout().clone());
    let (newest, intact, skipped) = store.newest_intact().expect("the earlier ones are intact");
    assert!(
        skipped.is_empty(),
        "no half-written checkpoint: {skipped:?}"
    );
    println!(
        "still valid: {} (version {})",
        newest.display(),
        intact.version
    );
    assert!(
        !std::fs::read_dir(&dir).expect("dir").any(|e| e
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .starts_with(".tmp")),
        "the failed write cleaned up after itself"
    );

    std::fs::remove_file(&filler).expect("rm");
    let back = wait_status(&mut status, "checkpoints again", |s| {
        report(s).written > written && report(s).last_error.is_none()
    })
    .await;
    let written = report(&back).written;

    fs.remount("ro");
    let ro = wait_status(&mut status, "a read-only failure", |s| {
        report(s).last_error.is_some()
    })
    .await;
    let error = report(&ro).last_error.clone().expect("why");
    println!("read-only: {error}");
    assert!(error.contains("Read-only file system"), "{error}");
    fs.remount("rw");
    wait_status(&mut status, "checkpoints after remounting", |s| {
        report(s).written > written && report(s).last_error.is_none()
    })
    .await;

    let filler = fs.fill();
    let summary = guard("stop", server.stop()).await.expect("clean stop");
    let error = summary
        .checkpoint_error
        .expect("the final checkpoint could not be written");
    println!("at stopping: {error}");
    assert!(error.contains("No space left on device"), "{error}");
    std::fs::remove_file(filler).expect("rm");
    assert!(
        store.newest_intact().is_ok(),
        "what was written is still valid"
    );
    cancel.cancel();
    let _ = guard("worker", task).await;
}
