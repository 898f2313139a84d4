// ---- a GPT (model/src/gpt): the operations a chain lacks, forward and backward ----
// Its linear layers (GPT-2's Conv1D, W [in, out]) are the dense kernels above. `lab` holds
// the N positions' targets, then their tokens; `act` each block's tensors in turn
// (worker-wasm/src/gpu/gpt_plan.rs), `dact` their gradients at the same offsets. Every sum
// runs in a fixed order, as the CPU path's (model/src/gpt/ops.rs), with WGSL's `exp`.

// h[n, c] = wte[token n, c] + wpe[n % T, c].
// p1 C, p2 T, p3 N (the tokens at lab[N..]), p4 wte, p5 wpe (w), p6 h (act)
@compute @workgroup_size(64)
fn gpt_embed(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  let r = i / u.p1; let c = i % u.p1;
  let token = lab[u.p3 + r];
  act[u.p6 + i] = w[u.p4 + token * u.p1 + c] + w[u.p5 + (r % u.p2) * u.p1 + c];
}

// dwte[v, c] += Σ_n [token n = v]·dh[n, c] (after the head's share, already in g);
// dwpe[t, c] = Σ_b dh[b·T + t, c]. Values V·C, then T·C.
// p1 C, p2 T, p3 N, p4 V, p5 dh (dact), p6 wte, p7 wpe (g)
@compute @workgroup_size(64)
fn gpt_embed_weights(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  let tokens = u.p4 * u.p1;
  if (i < tokens) {
    let v = i / u.p1; let c = i % u.p1;
    var s = g[u.p6 + i];
    for (var r = 0u; r < u.p3; r++) {
      if (lab[u.p3 + r] == v) { s += dact[u.p5 + r * u.p1 + c]; }
    }
    g[u.p6 + i] = s;
    return;
  }
  let j = i - tokens;
  let t = j / u.p1; let c = j % u.p1;
  var s = 0.0;
  for (var r = t; r < u.p3; r += u.p2) { s += dact[u.p5 + r * u.p1 + c]; }
  g[u.p7 + j] = s;
}

// ---- LayerNorm, the biased variance, eps 1e-5; one invocation a row ----
// p1 C, p2 x, p3 y, p4 stats (act: each row's mean and 1/sqrt(var + eps)), p5 g, p6 b (w)
@compute @workgroup_size(64)
fn layer_norm_forward(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let r = index(id, n);
  if (r >= u.p0) { return; }
  let x = u.p2 + r * u.p1; let y = u.p3 + r * u.p1;
  let inv_c = 1.0 / f32(u.p1);
  var s = 0.0;
  for (var j = 0u; j < u.p1; j++) { s += act[x + j]; }
  let mean = s * inv_c;
  var v = 0.0;
  for (var j = 0u; j < u.p1; j++) { let d = act[x + j] - mean; v += d * d; }
  let rstd = 1.0 / sqrt(v * inv_c + 1e-5);
  for (var j = 0u; j < u.p1; j++) {
    act[y + j] = (act[x + j] - mean) * rstd * w[u.p5 + j] + w[u.p6 + j];
  }
  act[u.p4 + 2u * r] = mean;
  act[u.p4 + 2u * r + 1u] = rstd;
}

// dx = rstd·(dŷ − mean(dŷ) − x̂·mean(dŷ·x̂)), dŷ = dy·g, plus the residual's gradient dres
// when p7 is 1. One invocation a row.
// p1 C, p2 x, p3 stats (act), p4 dy, p5 dx, p6 dres (dact), p7 add dres, p8 g (w)
@compute @workgroup_size(64)
fn layer_norm_input(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let r = index(id, n);
  if (r >= u.p0) { return; }
  let x = u.p2 + r * u.p1; let dy = u.p4 + r * u.p1;
  let mean = act[u.p3 + 2u * r]; let rstd = act[u.p3 + 2u * r + 1u];
  let inv_c = 1.0 / f32(u.p1);
  var sum_d = 0.0; var sum_dx = 0.0;
  for (var j = 0u; j < u.p1; j++) {
    let d = dact[dy + j] * w[u.p8 + j];
    sum_d += d;
    sum_dx += d * ((act[x + j] - mean) * rstd);
  }
  let mean_d = sum_d * inv_c; let mean_dx = sum_dx * inv_c;
  for (var j = 0u; j < u.p1; j++) {
    let d = dact[dy + j] * w[u.p8 + j];
    let xhat = (act[x + j] - mean) * rstd;
    var out = (d - mean_d - xhat * mean_dx) * rstd;
    if (u.p7 == 1u) { out += dact[u.p6 + r * u.p1 + j]; }
    dact[u.p5 + r * u.p1 + j] = out;
  }
}

// dg[j] = Σ_r dy[r, j]·x̂[r, j], then db[j] = Σ_r dy[r, j]: values 2C.
// p1 C, p2 x, p3 stats (act), p4 dy (dact), p5 dg, p6 db (g), p7 rows
@compute @workgroup_size(64)
fn layer_norm_weights(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  var s = 0.0;
  if (i < u.p1) {
    for (var r = 0u; r < u.p7; r++) {
      let xhat = (act[u.p2 + r * u.p1 + i] - act[u.p3 + 2u * r]) * act[u.p3 + 2u * r + 1u];
      s += dact[u.p4 + r * u.p1 + i] * xhat;
    }
    g[u.p5 + i] = s;
    return;
  }
  let j = i - u.p1;
  for (var r = 0u; r < u.p7; r++) { s += dact[u.p4 + r * u.p1 + j]; }
  g[u.p6 + j] = s;
}

// ---- causal self-attention: qkv rows [q | k | v], heads side by side in each ----
// att[(b·H + h)·T + i, j] = softmax over j ≤ i of q_i·k_j / sqrt(hs), 0 above the
// diagonal. One invocation a row (b, h, i).
// p1 T, p2 H, p3 C, p4 qkv, p5 att (act)
@compute @workgroup_size(64)
fn attention_forward(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let row = index(id, n);
  if (row >= u.p0) { return; }
  let t = u.p1; let i = row % t; let h = (row / t) % u.p2; let b = row / (t * u.p2);
  let hs = u.p3 / u.p2; let stride = 3u * u.p3;
  let scale = 1.0 / sqrt(f32(hs));
  let q = u.p4 + (b * t + i) * stride + h * hs;
  let a = u.p5 + row * t;
  var top = 0.0;
  for (var j = 0u; j <= i; j++) {
    let k = u.p4 + (b * t + j) * stride + u.p3 + h * hs;
    var s = 0.0;
    for (var d = 0u; d < hs; d++) { s += act[q + d] * act[k + d]; }
    s = s * scale;
    act[a + j] = s;
    top = select(max(top, s), s, j == 0u);
  }
  var sum = 0.0;
  for (var j = 0u; j <= i; j++) {
    let e = exp(act[a + j] - top);
    act[a + j] = e;
    sum += e;
  }
  let inv = 1.0 / sum;
  for (var j = 0u; j < t; j++) { act[a + j] = select(0.0, act[a + j] * inv, j <= i); }
}

// y[b·T + i, h·hs + d] = Σ_{j ≤ i} att[(b·H + h)·T + i, j]·v[b·T + j, h·hs + d].
// p1 T, p2 H, p3 C, p4 qkv, p5 att, p6 y (act)
@compute @workgroup_size(64)
fn attention_values(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  let t = u.p1; let r = i / u.p3; let col = i % u.p3;
  let h = col / (u.p3 / u.p2); let b = r / t; let at = r % t;
  let a = u.p5 + ((b * u.p2 + h) * t + at) * t;
  var s = 0.0;
  for (var j = 0u; j <= at; j++) { s += act[a + j] * act[u.p4 + (b * t + j) * 3u * u.p3 + 2u * u.p3 + col]; }
  act[u.p6 + i] = s;
}

// The scores' gradient, one invocation a row (b, h, i): da_j = dy_i·v_j, then softmax's
// backward ds_j = a_j·(da_j − Σ_k a_k·da_k)·scale for j ≤ i, 0 above, into dact at att.
// p1 T, p2 H, p3 C, p4 qkv, p5 att (act; ds in dact), p6 dy (dact)
@compute @workgroup_size(64)
fn attention_scores_input(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let row = index(id, n);
  if (row >= u.p0) { return; }
  let t = u.p1; let i = row % t; let h = (row / t) % u.p2; let b = row / (t * u.p2);
  let hs = u.p3 / u.p2; let stride = 3u * u.p3;
  let scale = 1.0 / sqrt(f32(hs));
  let dy = u.p6 + (b * t + i) * u.p3 + h * hs;
  let a = u.p5 + row * t;
  var dot = 0.0;
  for (var j = 0u; j <= i; j++) {
    let v = u.p4 + (b * t + j) * stride + 2u * u.p3 + h * hs;
    var s = 0.0;
    for (var d = 0u; d < hs; d++) { s += dact[dy + d] * act[v + d]; }
    dact[a + j] = s;
    dot += act[a + j] * s;
  }
  for (var j = 0u; j < t; j++) {
    dact[a + j] = select(0.0, act[a + j] * (dact[a + j] - dot) * scale, j <= i);
  }
}

// dqkv, one invocation a value: dq_i = Σ_{j ≤ i} ds[i, j]·k_j; dk_j = Σ_{i ≥ j} ds[i, j]·q_i;
// dv_j = Σ_{i ≥ j} att[i, j]·dy_i.
// p1 T, p2 H, p3 C, p4 qkv (act; dqkv in dact), p5 att (act; ds in dact), p6 dy (dact)
@compute @workgroup_size(64)
fn attention_input(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  let t = u.p1; let stride = 3u * u.p3;
  let r = i / stride; let col = i % stride;
  let part = col / u.p3; let c = col % u.p3;
  let h = c / (u.p3 / u.p2); let b = r / t; let at = r % t;
  let rows = u.p5 + (b * u.p2 + h) * t * t;
  var s = 0.0;
  if (part == 0u) {
    for (var j = 0u; j <= at; j++) { s += dact[rows + at * t + j] * act[u.p4 + (b * t + j) * stride + u.p3 + c]; }
  } else if (part == 1u) {
    for (var q = at; q < t; q++) { s += dact[rows + q * t + at] * act[u.p4 + (b * t + q) * stride + c]; }
  } else {
    for (var q = at; q < t; q++) { s += act[rows + q * t + at] * dact[u.p6 + (b * t + q) * u.p3 + c]; }
  }
  dact[u.p4 + i] = s;
}

// ---- the residual stream, GELU's tanh form, the tied head ----

// out = a + b. p1 a, p2 b, p3 out (act)
@compute @workgroup_size(64)
fn add(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  act[u.p3 + i] = act[u.p1 + i] + act[u.p2 + i];
}

// GELU's tanh(sqrt(2/π)·(x + 0.044715 x³)), as 1 − 2/(exp(2u) + 1) (the CPU path's form).
fn gelu_tanh(x: f32) -> f32 {
  let v = 0.7978845608028654 * (x + 0.044715 * x * x * x);
  return 1.0 - 2.0 / (exp(2.0 * v) + 1.0);
}

// p1 x, p2 y (act)
@compute @workgroup_size(64)
fn gelu_tanh_forward(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  let x = act[u.p1 + i];
  act[u.p2 + i] = 0.5 * x * (1.0 + gelu_tanh(x));
}

// p1 x (act), p3 dx, p4 dy (dact)
@compute @workgroup_size(64)
fn gelu_tanh_input(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  let x = act[u.p1 + i];
  let t = gelu_tanh(x);
  let slope = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
  dact[u.p3 + i] = dact[u.p4 + i] * slope;
}

// logits[n, v] = Σ_c lnf[n, c]·wte[v, c]. p1 V, p2 C, p3 lnf, p4 logits (act), p5 wte (w)
@compute @workgroup_size(64)
fn gpt_head_forward(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  let r = i / u.p1; let v = i % u.p1;
  var s = 0.0;
  for (var c = 0u; c < u.p2; c++) { s += act[u.p3 + r * u.p2 + c] * w[u.p5 + v * u.p2 + c]; }
  act[u.p4 + i] = s;
}

// dwte[v, c] = Σ_n dlogits[n, v]·lnf[n, c] (the embedding's share is added after).
// p1 V, p2 C, p3 lnf (act), p4 dlogits (dact), p5 wte (g), p6 N
@compute @workgroup_size(64)
fn gpt_head_weights(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  let v = i / u.p2; let c = i % u.p2;
  var s = 0.0;
  for (var r = 0u; r < u.p6; r++) { s += dact[u.p4 + r * u.p1 + v] * act[u.p3 + r * u.p2 + c]; }
  g[u.p5 + i] = s;
}

// dlnf[n, c] = Σ_v dlogits[n, v]·wte[v, c]. p1 V, p2 C, p3 dlnf, p4 dlogits (dact), p5 wte (w)
@compute @workgroup_size(64)
fn gpt_head_input(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = index(id, n);
  if (i >= u.p0) { return; }
  let r = i / u.p2; let c = i % u.p2;
  var s = 0.0;
  for (var v = 0u; v < u.p1; v++) { s += dact[u.p4 + r * u.p1 + v] * w[u.p5 + v * u.p2 + c]; }
  dact[u.p3 + i] = s;
}
