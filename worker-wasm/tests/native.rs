//! The reference `build.rs` wrote is what this native build computes, bit for bit: the
//! browser test's reference really is "the native build's gradient".

#![cfg(not(target_arch = "wasm32"))]

#[path = "../src/fixture.rs"]
mod fixture;

#[test]
fn build_script_reference_is_this_native_builds_gradient() {
    let reference = include_bytes!(concat!(env!("OUT_DIR"), "/native_gradient.bin"));
    let (loss, grads) = fixture::gradient();
    assert_eq!(grads.len(), 101_770);
    assert!(fixture::gradient_bytes(loss, &grads) == reference.as_slice());
}
