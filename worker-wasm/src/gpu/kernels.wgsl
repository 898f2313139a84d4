// crowdtrain's GPU path: every layer's forward and backward, and the loss, as compute
// kernels (worker-wasm/src/gpu). One invocation computes one value (the dense kernels a
// tile of 4 × 4), each summed in a fixed order; the values differ from the CPU path's by rounding only (docs/DESIGN.md#a-tabs-gpu).
//
// Buffers, one bind group for every kernel:
//   w    the weights, full layout        g    the gradient, full layout
//   act  the input, then each layer's output (a flatten shares its input's)
//   dact the loss's gradient with respect to each of them
//   mask the dropout layers' multipliers  lab  the labels   loss  each row's loss
// `u.p0` is always the number of values to compute; the rest is per kernel.

struct U {
  p0: u32, p1: u32, p2: u32, p3: u32, p4: u32, p5: u32, p6: u32, p7: u32,
  p8: u32, p9: u32, p10: u32, p11: u32, p12: u32, p13: u32, p14: u32, p15: u32,
}

@group(0) @binding(0) var<uniform> u: U;
@group(0) @binding(1) var<storage, read_write> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> g: array<f32>;
@group(0) @binding(3) var<storage, read_write> act: array<f32>;
@group(0) @binding(4) var<storage, read_write> dact: array<f32>;
@group(0) @binding(5) var<storage, read_write> mask: array<f32>;
@group(0) @binding(6) var<storage, read_write> lab: array<u32>;
@group(0) @binding(7) var<storage, read_write> loss: array<f32>;

const WG: u32 = 64u;

// The value this invocation computes: dispatches wider than 65,535 workgroups use y too.
fn index(id: vec3<u32>, groups: vec3<u32>) -> u32 {
  return id.x + id.y * groups.x * WG;
}

// ---- dense: y = x·W + b, W [nin, nout]; a tile of 4 × 4 values an invocation ----
// Each value is still one sum in one order; a tile shares its loads (four rows' inputs
// against four columns' weights), a quarter of the reads one value an invocation takes.
// A tile at an edge reads the last row or column again (clamped) and writes only its own.
// `u.p0` is the number of tiles (dense.rs).

// The four columns from `c0` (of `cols`), clamped to the last.
fn four(c0: u32, cols: u32) -> vec4<u32> {
  return min(vec4<u32>(c0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(cols - 1u));
}

// p1 n, p2 nin, p3 nout, p4 x, p5 y (act), p6 W, p7 b (w)
@compute @workgroup_size(64)
fn dense_forward(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  let tiles = (u.p3 + 3u) / 4u;
  let r0 = i / tiles * 4u; let o0 = i % tiles * 4u;
  let o = four(o0, u.p3);
  let x = vec4<u32>(u.p4) + four(r0, u.p1) * u.p2;
  var s0 = vec4<f32>(0.0); var s1 = vec4<f32>(0.0); var s2 = vec4<f32>(0.0); var s3 = vec4<f32>(0.0);
  for (var k = 0u; k < u.p2; k++) {
    let row = u.p6 + k * u.p3;
    let wk = vec4<f32>(w[row + o.x], w[row + o.y], w[row + o.z], w[row + o.w]);
    s0 += act[x.x + k] * wk; s1 += act[x.y + k] * wk;
    s2 += act[x.z + k] * wk; s3 += act[x.w + k] * wk;
  }
  let b = vec4<f32>(w[u.p7 + o.x], w[u.p7 + o.y], w[u.p7 + o.z], w[u.p7 + o.w]);
  let rows = array<vec4<f32>, 4>(s0 + b, s1 + b, s2 + b, s3 + b);
  for (var a = 0u; a < 4u && r0 + a < u.p1; a++) {
    for (var c = 0u; c < 4u && o0 + c < u.p3; c++) {
      act[u.p5 + (r0 + a) * u.p3 + o0 + c] = rows[a][c];
    }
  }
}

// dW[k, o] = Σ_r x[r, k]·dy[r, o], tiles of 4 k × 4 o; then db[o] = Σ_r dy[r, o], one
// invocation a bias after the tiles.
// p1 n, p2 nin, p3 nout, p4 x (act), p5 dy (dact), p6 dW, p7 db (g)
@compute @workgroup_size(64)
fn dense_weights(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  let tiles = (u.p3 + 3u) / 4u;
  let weights = (u.p2 + 3u) / 4u * tiles;
  if (i >= weights) {
    let o = i - weights;
    var s = 0.0;
    for (var r = 0u; r < u.p1; r++) { s += dact[u.p5 + r * u.p3 + o]; }
    g[u.p7 + o] = s;
    return;
  }
  let k0 = i / tiles * 4u; let o0 = i % tiles * 4u;
  let k = four(k0, u.p2);
  let o = four(o0, u.p3);
  var s0 = vec4<f32>(0.0); var s1 = vec4<f32>(0.0); var s2 = vec4<f32>(0.0); var s3 = vec4<f32>(0.0);
  for (var r = 0u; r < u.p1; r++) {
    let x = u.p4 + r * u.p2; let dy = u.p5 + r * u.p3;
    let d = vec4<f32>(dact[dy + o.x], dact[dy + o.y], dact[dy + o.z], dact[dy + o.w]);
    s0 += act[x + k.x] * d; s1 += act[x + k.y] * d;
    s2 += act[x + k.z] * d; s3 += act[x + k.w] * d;
  }
  let rows = array<vec4<f32>, 4>(s0, s1, s2, s3);
  for (var a = 0u; a < 4u && k0 + a < u.p2; a++) {
    for (var c = 0u; c < 4u && o0 + c < u.p3; c++) {
      g[u.p6 + (k0 + a) * u.p3 + o0 + c] = rows[a][c];
    }
  }
}

// dx[r, k] = Σ_o dy[r, o]·W[k, o], tiles of 4 r × 4 k.
// p1 n, p2 nin, p3 nout, p4 dy, p5 dx (dact), p6 W
@compute @workgroup_size(64)
fn dense_input(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  let tiles = (u.p2 + 3u) / 4u;
  let r0 = i / tiles * 4u; let k0 = i % tiles * 4u;
  let dy = vec4<u32>(u.p4) + four(r0, u.p1) * u.p3;
  let wk = vec4<u32>(u.p6) + four(k0, u.p2) * u.p3;
  var s0 = vec4<f32>(0.0); var s1 = vec4<f32>(0.0); var s2 = vec4<f32>(0.0); var s3 = vec4<f32>(0.0);
  for (var o = 0u; o < u.p3; o++) {
    let wo = vec4<f32>(w[wk.x + o], w[wk.y + o], w[wk.z + o], w[wk.w + o]);
    s0 += dact[dy.x + o] * wo; s1 += dact[dy.y + o] * wo;
    s2 += dact[dy.z + o] * wo; s3 += dact[dy.w + o] * wo;
  }
  let rows = array<vec4<f32>, 4>(s0, s1, s2, s3);
  for (var a = 0u; a < 4u && r0 + a < u.p1; a++) {
    for (var c = 0u; c < 4u && k0 + c < u.p2; c++) {
      dact[u.p5 + (r0 + a) * u.p2 + k0 + c] = rows[a][c];
    }
  }
}

// ---- conv2d: W [F, C, k, k] then b [F]; rows channel-major ----
// p1 n, p2 C, p3 H, p4 W, p5 F, p6 OH, p7 OW, p8 k, p9 stride, p10 padding,
// p11 x, p12 y (act, dact), p13 W, p14 b
@compute @workgroup_size(64)
fn conv_forward(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  let ox = i % u.p7; let oy = (i / u.p7) % u.p6; let f = (i / (u.p7 * u.p6)) % u.p5;
  let r = i / (u.p7 * u.p6 * u.p5);
  var s = 0.0;
  for (var c = 0u; c < u.p2; c++) {
    for (var ky = 0u; ky < u.p8; ky++) {
      let iy = i32(oy * u.p9 + ky) - i32(u.p10);
      if (iy < 0 || iy >= i32(u.p3)) { continue; }
      for (var kx = 0u; kx < u.p8; kx++) {
        let ix = i32(ox * u.p9 + kx) - i32(u.p10);
        if (ix < 0 || ix >= i32(u.p4)) { continue; }
        s += act[u.p11 + ((r * u.p2 + c) * u.p3 + u32(iy)) * u.p4 + u32(ix)]
           * w[u.p13 + ((f * u.p2 + c) * u.p8 + ky) * u.p8 + kx];
      }
    }
  }
  act[u.p12 + i] = s + w[u.p14 + f];
}

// dW[f, c, ky, kx] = Σ_r,oy,ox dy[r, f, oy, ox]·x[r, c, iy, ix]; db[f] = Σ dy[r, f, ·, ·].
@compute @workgroup_size(64)
fn conv_weights(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  let weights = u.p5 * u.p2 * u.p8 * u.p8;
  let plane = u.p6 * u.p7;
  var s = 0.0;
  if (i >= weights) {
    let f = i - weights;
    for (var r = 0u; r < u.p1; r++) {
      for (var o = 0u; o < plane; o++) { s += dact[u.p12 + (r * u.p5 + f) * plane + o]; }
    }
    g[u.p14 + f] = s;
    return;
  }
  let kx = i % u.p8; let ky = (i / u.p8) % u.p8; let c = (i / (u.p8 * u.p8)) % u.p2;
  let f = i / (u.p8 * u.p8 * u.p2);
  for (var r = 0u; r < u.p1; r++) {
    for (var oy = 0u; oy < u.p6; oy++) {
      let iy = i32(oy * u.p9 + ky) - i32(u.p10);
      if (iy < 0 || iy >= i32(u.p3)) { continue; }
      for (var ox = 0u; ox < u.p7; ox++) {
        let ix = i32(ox * u.p9 + kx) - i32(u.p10);
        if (ix < 0 || ix >= i32(u.p4)) { continue; }
        s += dact[u.p12 + ((r * u.p5 + f) * u.p6 + oy) * u.p7 + ox]
           * act[u.p11 + ((r * u.p2 + c) * u.p3 + u32(iy)) * u.p4 + u32(ix)];
      }
    }
  }
  g[u.p13 + i] = s;
}

// dx[r, c, iy, ix] = Σ_f,ky,kx dy[r, f, oy, ox]·W[f, c, ky, kx] where oy·stride + ky − padding = iy.
// p11 dx, p12 dy (dact)
@compute @workgroup_size(64)
fn conv_input(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  let ix = i % u.p4; let iy = (i / u.p4) % u.p3; let c = (i / (u.p4 * u.p3)) % u.p2;
  let r = i / (u.p4 * u.p3 * u.p2);
  var s = 0.0;
  for (var f = 0u; f < u.p5; f++) {
    for (var ky = 0u; ky < u.p8; ky++) {
      let ty = i32(iy + u.p10) - i32(ky);
      if (ty < 0 || u32(ty) % u.p9 != 0u || u32(ty) / u.p9 >= u.p6) { continue; }
      let oy = u32(ty) / u.p9;
      for (var kx = 0u; kx < u.p8; kx++) {
        let tx = i32(ix + u.p10) - i32(kx);
        if (tx < 0 || u32(tx) % u.p9 != 0u || u32(tx) / u.p9 >= u.p7) { continue; }
        let ox = u32(tx) / u.p9;
        s += dact[u.p12 + ((r * u.p5 + f) * u.p6 + oy) * u.p7 + ox]
           * w[u.p13 + ((f * u.p2 + c) * u.p8 + ky) * u.p8 + kx];
      }
    }
  }
  dact[u.p11 + i] = s;
}

// ---- pools, per channel, windows of size × size every stride ----
// p1 n, p2 C, p3 H, p4 W, p5 OH, p6 OW, p7 size, p8 stride, p9 x, p10 y, p11 dx, p12 dy

// The input index (within the sample's row) of the first maximum of window (oy, ox).
fn argmax(row: u32, c: u32, oy: u32, ox: u32) -> u32 {
  let corner = (c * u.p3 + oy * u.p8) * u.p4 + ox * u.p8;
  var best = corner;
  for (var ky = 0u; ky < u.p7; ky++) {
    for (var kx = 0u; kx < u.p7; kx++) {
      let at = corner + ky * u.p4 + kx;
      if (act[u.p9 + row + at] > act[u.p9 + row + best]) { best = at; }
    }
  }
  return best;
}

@compute @workgroup_size(64)
fn max_pool_forward(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  let ox = i % u.p6; let oy = (i / u.p6) % u.p5; let c = (i / (u.p6 * u.p5)) % u.p2;
  let row = (i / (u.p6 * u.p5 * u.p2)) * u.p2 * u.p3 * u.p4;
  act[u.p10 + i] = act[u.p9 + row + argmax(row, c, oy, ox)];
}

// The outputs whose window holds input coordinate `v`: `lo..hi`.
fn covering(v: u32, outputs: u32) -> vec2<u32> {
  let lo = select(0u, (v + 1u - u.p7 + u.p8 - 1u) / u.p8, v + 1u > u.p7);
  let hi = min(v / u.p8 + 1u, outputs);
  return vec2<u32>(lo, max(lo, hi));
}

// dx: each input gathers the gradients of the windows whose first maximum it is, in
// output order (the CPU path adds in the same order).
@compute @workgroup_size(64)
fn max_pool_input(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  let plane = u.p3 * u.p4;
  let ix = i % u.p4; let iy = (i / u.p4) % u.p3; let c = (i / plane) % u.p2;
  let r = i / (plane * u.p2);
  let row = r * u.p2 * plane;
  let here = i - row;
  let ys = covering(iy, u.p5); let xs = covering(ix, u.p6);
  var s = 0.0;
  for (var oy = ys.x; oy < ys.y; oy++) {
    for (var ox = xs.x; ox < xs.y; ox++) {
      if (argmax(row, c, oy, ox) == here) {
        s += dact[u.p12 + ((r * u.p2 + c) * u.p5 + oy) * u.p6 + ox];
      }
    }
  }
  dact[u.p11 + i] = s;
}

@compute @workgroup_size(64)
fn avg_pool_forward(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  let ox = i % u.p6; let oy = (i / u.p6) % u.p5; let c = (i / (u.p6 * u.p5)) % u.p2;
  let row = (i / (u.p6 * u.p5 * u.p2)) * u.p2 * u.p3 * u.p4;
  let corner = (c * u.p3 + oy * u.p8) * u.p4 + ox * u.p8;
  var s = 0.0;
  for (var ky = 0u; ky < u.p7; ky++) {
    for (var kx = 0u; kx < u.p7; kx++) { s += act[u.p9 + row + corner + ky * u.p4 + kx]; }
  }
  act[u.p10 + i] = s / f32(u.p7 * u.p7);
}

@compute @workgroup_size(64)
fn avg_pool_input(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  let plane = u.p3 * u.p4;
  let ix = i % u.p4; let iy = (i / u.p4) % u.p3; let c = (i / plane) % u.p2;
  let r = i / (plane * u.p2);
  let ys = covering(iy, u.p5); let xs = covering(ix, u.p6);
  let area = f32(u.p7 * u.p7);
  var s = 0.0;
  for (var oy = ys.x; oy < ys.y; oy++) {
    for (var ox = xs.x; ox < xs.y; ox++) {
      s += dact[u.p12 + ((r * u.p2 + c) * u.p5 + oy) * u.p6 + ox] / area;
    }
  }
  dact[u.p11 + i] = s;
}

// ---- element-wise: p1 x, p2 y, p3 dx, p4 dy, p5 mask ----

// erf by Abramowitz and Stegun 7.1.26 (|error| < 1.5e-7).
fn erf(v: f32) -> f32 {
  let a = abs(v);
  let t = 1.0 / (1.0 + 0.3275911 * a);
  let y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t
    + 0.254829592) * t * exp(-a * a);
  return select(-y, y, v >= 0.0);
}

fn gelu_cdf(v: f32) -> f32 { return 0.5 * (1.0 + erf(v * 0.70710678118654752)); }

@compute @workgroup_size(64)
fn relu_forward(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  act[u.p2 + i] = select(0.0, act[u.p1 + i], act[u.p1 + i] > 0.0);
}

@compute @workgroup_size(64)
fn relu_input(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  dact[u.p3 + i] = select(0.0, dact[u.p4 + i], act[u.p1 + i] > 0.0);
}

@compute @workgroup_size(64)
fn tanh_forward(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  act[u.p2 + i] = tanh(act[u.p1 + i]);
}

@compute @workgroup_size(64)
fn tanh_input(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  let t = act[u.p2 + i];
  dact[u.p3 + i] = dact[u.p4 + i] * (1.0 - t * t);
}

@compute @workgroup_size(64)
fn gelu_forward(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  let v = act[u.p1 + i];
  act[u.p2 + i] = v * gelu_cdf(v);
}

@compute @workgroup_size(64)
fn gelu_input(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  let v = act[u.p1 + i];
  let slope = gelu_cdf(v) + v * 0.3989422804014327 * exp(-(v * v) * 0.5);
  dact[u.p3 + i] = dact[u.p4 + i] * slope;
}

@compute @workgroup_size(64)
fn dropout_forward(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  act[u.p2 + i] = act[u.p1 + i] * mask[u.p5 + i];
}

@compute @workgroup_size(64)
fn dropout_input(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  dact[u.p3 + i] = dact[u.p4 + i] * mask[u.p5 + i];
}

// ---- softmax cross-entropy, one invocation a row ----
// p1 classes, p2 batch (the mean's divisor), p3 logits (act), p4 their gradient (dact)
@compute @workgroup_size(64)
fn softmax_cross_entropy(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let r = index(id, n);
  if (r >= u.p0) { return; }
  let z = u.p3 + r * u.p1; let d = u.p4 + r * u.p1;
  var top = act[z];
  for (var j = 1u; j < u.p1; j++) { top = max(top, act[z + j]); }
  var sum = 0.0;
  for (var j = 0u; j < u.p1; j++) {
    let e = exp(act[z + j] - top);
    dact[d + j] = e;
    sum += e;
  }
  let label = lab[r];
  let inv_n = 1.0 / f32(u.p2);
  loss[r] = log(sum) - (act[z + label] - top);
  for (var j = 0u; j < u.p1; j++) { dact[d + j] = dact[d + j] / sum * inv_n; }
  dact[d + label] -= inv_n;
}
