use crate::util::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_params_health_and_static_files() {
    let server = start_server(&["--eval-interval", "2"]).await;
    let mut status = server.status.clone();

    let (code, _, body) = http_get(server.addr, "/healthz").await;
    assert_eq!((code, body.as_slice()), (200, b"ok".as_slice()));

    let json = get_status_json(server.addr).await;
    for key in [
        "round",
        "workers",
        "test_accuracy",
        "test_loss",
        "samples_seen",
        "state",
    ] {
        assert!(json.get(key).is_some(), "status lacks {key}: {json}");
    }
    assert_eq!(json["state"], "waiting");
    assert_eq!(json["test_accuracy"], serde_json::Value::Null);
    assert_eq!(json["workers"], 0);

    let _w = spawn_worker(server.addr);
    wait_status(&mut status, "an evaluation", |s| {
        s.evaluated_round.is_some()
    })
    .await;
    let json = get_status_json(server.addr).await;
    assert_eq!(json["state"], "training");
    assert_eq!(json["workers"], 1);
    assert!(json["test_accuracy"].as_f64().expect("evaluated") > 0.0);
    assert!(json["samples_seen"].as_u64().expect("number") >= 64);

    // /api/params is safetensors whose tensors are exactly the published weights.
    let (code, head, body) = http_get(server.addr, "/api/params").await;
    assert_eq!(code, 200);
    let round: u64 = head
        .lines()
        .find_map(|l| l.strip_prefix("x-crowdtrain-round: "))
        .expect("round header")
        .parse()
        .expect("number");
    let (header, values) = parse_safetensors(&body);
    assert_eq!(header["l0.weight"]["shape"], serde_json::json!([784, 128]));
    assert_eq!(header["l1.bias"]["dtype"], "F32");
    assert_eq!(values.len(), 784 * 128 + 128 + 128 * 10 + 10);
    assert_eq!(header["__metadata__"]["round"], round.to_string());
    assert!(values.iter().all(|v| v.is_finite()));

    let (code, _, body) = http_get(server.addr, "/").await;
    assert_eq!(code, 200);
    assert!(String::from_utf8_lossy(&body).contains("crowdtrain"));
    let (code, _, _) = http_get(server.addr, "/no-such-file").await;
    assert_eq!(code, 404);

    stop(server).await;
}

/// `/metrics` parses as a Prometheus exposition, follows the naming conventions, and its
/// counters are exactly `/api/status`'s; the histograms counted every round and gradient.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_and_match_the_status() {
    let server = start_server(&[]).await;
    let mut status = server.status.clone();
    let (task, cancel) = spawn_worker(server.addr);
    wait_status(&mut status, "an evaluation", |s| {
        s.evaluated_round.is_some()
    })
    .await;
    // With its only worker gone and its last answer's replay back (it runs off the
    // coordinator's task), the run waits, so both documents describe the same moment.
    cancel.cancel();
    let _ = guard("the worker", task).await;
    wait_status(
        &mut status,
        "the worker gone, nothing being recomputed",
        |s| s.workers == 0 && s.recomputing == 0,
    )
    .await;

    let (code, head, body) = http_get(server.addr, "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        head.to_ascii_lowercase().contains("openmetrics-text"),
        "{head}"
    );
    let text = String::from_utf8(body).expect("utf-8");
    let scrape =
        prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("parses");
    let value = |name: &str| -> f64 {
        let sample = scrape
            .samples
            .iter()
            .find(|s| s.metric == name)
            .unwrap_or_else(|| panic!("{name} missing:\n{text}"));
        match &sample.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            other => panic!("{name}: {other:?}"),
        }
    };
    let json = get_status_json(server.addr).await;
    let n = |key: &str| json[key].as_f64().unwrap_or_else(|| panic!("{key}"));
    for (metric, key) in [
        ("crowdtrain_gradients_accepted_total", "gradients_accepted"),
        ("crowdtrain_gradients_rejected_total", "gradients_rejected"),
        ("crowdtrain_gradients_late_total", "late"),
        ("crowdtrain_gradients_verified_total", "gradients_verified"),
        ("crowdtrain_samples_total", "samples_seen"),
        ("crowdtrain_sessions_rejected_total", "sessions_rejected"),
        ("crowdtrain_round", "round"),
        ("crowdtrain_workers", "workers"),
        ("crowdtrain_test_accuracy", "test_accuracy"),
        ("crowdtrain_grad_norm_bound", "grad_norm_bound"),
        ("crowdtrain_parameters", "param_count"),
    ] {
        assert_eq!(value(metric), n(key), "{metric} vs {key}");
    }
    assert!(n("gradients_accepted") >= 10.0);
    // Every round's duration, and every gradient's latency, were observed.
    assert_eq!(value("crowdtrain_round_duration_seconds_count"), n("round"));
    assert!(value("crowdtrain_gradient_latency_seconds_count") >= n("gradients_accepted"));
    let histogram = scrape
        .samples
        .iter()
        .find(|s| s.metric == "crowdtrain_round_duration_seconds")
        .expect("histogram");
    assert!(matches!(&histogram.value, prometheus_parse::Value::Histogram(b) if b.len() > 10));
    for sample in &scrape.samples {
        assert!(
            sample.metric.starts_with("crowdtrain_"),
            "{}",
            sample.metric
        );
    }
    for line in text
        .lines()
        .filter(|l| l.starts_with("# TYPE") && l.ends_with(" counter"))
    {
        let name = line.split_whitespace().nth(2).expect("name");
        assert!(
            text.contains(&format!("\n{name}_total ")),
            "{name} has a _total sample"
        );
    }
    assert!(
        text.contains("crowdtrain_run_info{mode=\"sync\",aggregator=\"centered-clip\"} 1"),
        "{text}"
    );
    let (code, _, body) = http_get(server.addr, "/api/history").await;
    assert_eq!(code, 200);
    let history: serde_json::Value = serde_json::from_slice(&body).expect("json");
    let points = history.as_array().expect("points");
    assert_eq!(points.len() as f64, n("round"), "one point per update");
    let last = points.last().expect("a point");
    assert_eq!(last["round"].as_f64(), Some(n("round")));
    assert_eq!(
        last["gradients_accepted"].as_f64(),
        Some(n("gradients_accepted"))
    );
    assert!(
        points.iter().any(|p| p["test_accuracy"].is_number()),
        "evaluated rounds marked"
    );
    stop(server).await;
}

/// `/ws` answers what is not a WebSocket opening handshake with a 4xx that says what is
/// missing (the handshake is the coordinator's own, `server/src/edge/socket/handshake.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_is_not_a_websocket_handshake_is_told_why() {
    let server = start_server(&[]).await;
    let addr = server.addr;
    let upgrade = [("Connection", "upgrade"), ("Upgrade", "websocket")];
    let key = ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==");
    type Case<'a> = (&'a [(&'a str, &'a str)], u16, &'a str);
    let cases: [Case<'_>; 4] = [
        (&[], 400, "Connection header did not include 'upgrade'"),
        (
            &[upgrade[0]],
            400,
            "Upgrade header did not include 'websocket'",
        ),
        (
            &[upgrade[0], upgrade[1], ("Sec-WebSocket-Version", "8"), key],
            426,
            "Sec-WebSocket-Version must be 13",
        ),
        (
            &[upgrade[0], upgrade[1], ("Sec-WebSocket-Version", "13")],
            400,
            "Sec-WebSocket-Key header missing",
        ),
    ];
    for (headers, code, why) in cases {
        let (got, head, body) = http_request(addr, "GET /ws HTTP/1.1", headers, &[]).await;
        assert_eq!(got, code, "{headers:?}: {head}");
        assert_eq!(String::from_utf8_lossy(&body), why);
        if code == 426 {
            assert!(
                head.to_ascii_lowercase()
                    .contains("sec-websocket-version: 13"),
                "{head}"
            );
        }
    }
    server.shutdown.cancel();
}
