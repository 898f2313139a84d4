//! Runs on the build machine, natively: computes the reference gradient and encodes the
//! reference frames with the native build of the shared crates, for the wasm tests to compare
//! against (`tests/web.rs`). Nothing is committed; the reference is always fresh.

#[path = "src/fixture.rs"]
mod fixture;

use std::path::PathBuf;

use model::Order;

fn main() {
    println!("cargo:rerun-if-changed=src/fixture.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    // Each reference three times: in the library's float order (fused multiply-adds on a CPU
    // with FMA), unfused (a tab's order) and fused in the tab's order (a tab whose relaxed
    // SIMD fuses), which the browser must match bit for bit.
    for (order, suffix) in [
        (Order::Library, ""),
        (Order::Unfused, "_unfused"),
        (Order::Fused, "_fused"),
    ] {
        model::with_order(order, || {
            for preset in fixture::PRESETS {
                let (loss, grads) = fixture::gradient(preset);
                std::fs::write(
                    out.join(format!("native_gradient_{preset}{suffix}.bin")),
                    fixture::gradient_bytes(loss, &grads),
                )
                .expect("write the native gradient");
            }
            std::fs::write(
                out.join(format!("native_products{suffix}.bin")),
                fixture::gradient_bytes(0.0, &fixture::products()),
            )
            .expect("write the native products");
            let (loss, grads) = fixture::gpt_gradient();
            std::fs::write(
                out.join(format!("native_gradient_gpt{suffix}.bin")),
                fixture::gradient_bytes(loss, &grads),
            )
            .expect("write the native GPT gradient");
            for preset in fixture::PRESETS {
                let (loss, grads) = fixture::gradient_in_parts(preset);
                std::fs::write(
                    out.join(format!("native_gradient_{preset}_parts{suffix}.bin")),
                    fixture::gradient_bytes(loss, &grads),
                )
                .expect("write the native gradient in parts");
            }
            for (preset, name, optimizer) in fixture::phases() {
                let delta = fixture::local_phase(preset, optimizer);
                std::fs::write(
                    out.join(format!("native_phase_{preset}_{name}{suffix}.bin")),
                    fixture::gradient_bytes(0.0, &delta),
                )
                .expect("write the native phase");
            }
        });
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
        out.join("native_compressed_answers.bin"),
        fixture::pack(&fixture::compressed_answers()),
    )
    .expect("write frames");
    std::fs::write(
        out.join("native_coordinator_frames.bin"),
        fixture::pack(&coordinator),
    )
    .expect("write frames");
}
