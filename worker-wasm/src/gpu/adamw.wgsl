// AdamW's step on the GPU, as model/src/optim.rs takes it on the CPU (Adam: no decay), so
// that a local phase's weights and moments stay on the GPU between its commitments
// (worker-wasm/src/gpu/mod.rs, `Gpu::segment`). One invocation a value; the step's
// constants, computed on the CPU as the CPU path computes them, in `a`.

struct A {
  values: u32,
  // 1 - lr·weight_decay, for the decayed values only.
  keep: f32,
  // lr / (1 - beta1^t), and 1 - beta2^t.
  step: f32,
  c2: f32,
  b1: f32,
  nb1: f32,
  b2: f32,
  nb2: f32,
  eps: f32,
}

@group(0) @binding(0) var<uniform> a: A;
@group(0) @binding(1) var<storage, read_write> w: array<f32>;
@group(0) @binding(2) var<storage, read> g: array<f32>;
@group(0) @binding(3) var<storage, read_write> m: array<f32>;
@group(0) @binding(4) var<storage, read_write> v: array<f32>;
// 1 where the value is decayed (AdamW's mask: the matrices), else 0.
@group(0) @binding(5) var<storage, read> decay: array<u32>;

@compute @workgroup_size(64)
fn adamw(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = id.x + id.y * n.x * 64u;
  if (i >= a.values) { return; }
  var p = w[i];
  if (decay[i] != 0u) { p = p * a.keep; }
  let gi = g[i];
  let mi = a.b1 * m[i] + a.nb1 * gi;
  let vi = a.b2 * v[i] + a.nb2 * gi * gi;
  m[i] = mi;
  v[i] = vi;
  w[i] = p - a.step * mi / (sqrt(vi / a.c2) + a.eps);
}
