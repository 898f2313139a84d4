//! Runs on the build machine, natively: computes the reference gradient and encodes the
//! reference frames with the native build of the shared crates, for the wasm tests to compare
//! against (`tests/web.rs`). Nothing is committed; the reference is always fresh.

#[path = "src/fixture.rs"]
mod fixture;

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=src/fixture.rs");
    // matrixmultiply's switch to restrict its x86 kernels (e.g. `sse2`: no FMA). With it the
    // native reference must match the browser bit for bit, and the test demands exactly that.
    println!("cargo:rerun-if-env-changed=MMTEST_FEATURE");
    if std::env::var_os("MMTEST_FEATURE").is_some() {
        println!("cargo:rustc-env=CROWDTRAIN_REFERENCE_WITHOUT_FMA=1");
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for preset in fixture::PRESETS {
        let (loss, grads) = fixture::gradient(preset);
        std::fs::write(
            out.join(format!("native_gradient_{preset}.bin")),
            fixture::gradient_bytes(loss, &grads),
        )
        .expect("write the native gradient");
    }
    for (preset, name, optimizer) in fixture::phases() {
        let delta = fixture::local_phase(preset, optimizer);
        std::fs::write(
            out.join(format!("native_phase_{preset}_{name}.bin")),
            fixture::gradient_bytes(0.0, &delta),
        )
        .expect("write the native phase");
    }
    let worker: Vec<Vec<u8>> = fixture::worker_messages()
        .iter()
        .map(protocol::encode_from_worker)
        .collect();
    let coordinator: Vec<Vec<u8>> = fixture::coordinator_messages()
        .iter()
        .map(protocol::encode_from_coordinator)
        .collect();
    std::fs::write(out.join("native_worker_frames.bin"), fixture::pack(&worker))
        .expect("write frames");
    std::fs::write(
        out.join("native_coordinator_frames.bin"),
        fixture::pack(&coordinator),
    )
    .expect("write frames");
}
