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
