//! The reference `build.rs` wrote is what this native build computes, bit for bit: the
//! browser test's reference really is "the native build's gradient".

#![cfg(not(target_arch = "wasm32"))]

#[path = "../src/fixture.rs"]
mod fixture;

#[test]
fn build_script_reference_is_this_native_builds_gradient() {
    let mlp = include_bytes!(concat!(env!("OUT_DIR"), "/native_gradient_mlp.bin"));
    let (loss, grads) = fixture::gradient("mlp");
    assert_eq!(grads.len(), 101_770);
    assert!(fixture::gradient_bytes(loss, &grads) == mlp.as_slice());
    let cnn = include_bytes!(concat!(env!("OUT_DIR"), "/native_gradient_cnn.bin"));
    let (loss, grads) = fixture::gradient("cnn");
    assert_eq!(
        grads.len(),
        16 * 25 + 16 + 32 * 16 * 25 + 32 + 512 * 128 + 128 + 1290
    );
    assert!(fixture::gradient_bytes(loss, &grads) == cnn.as_slice());
}
