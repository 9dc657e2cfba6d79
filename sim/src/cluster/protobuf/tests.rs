use serde_json::json;

use super::*;

/// A length-delimited field, written out by hand from the field numbers in
/// `k8s.io/api/core/v1/generated.proto`, so these tests do not trust the code they test.
fn ld(number: u64, value: &[u8]) -> Vec<u8> {
    let mut out = varint((number << 3) | 2);
    out.extend(varint(value.len() as u64));
    out.extend_from_slice(value);
    out
}

fn varint(mut n: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

fn envelope(api_version: &[u8], kind: &[u8], raw: &[u8]) -> Vec<u8> {
    let type_meta = [ld(1, api_version), ld(2, kind)].concat();
    [b"k8s\0".as_slice(), &ld(1, &type_meta), &ld(2, raw)].concat()
}

#[test]
fn a_namespace_as_kubectl_sends_it_reads_as_its_json() {
    // metadata {name: "shop", labels {team: a}, creationTimestamp: zero, namespace: ""}
    // as Go writes it: empty strings and the zero time are present on the wire.
    let zero_time = ld(8, &[]);
    let label = ld(11, &[ld(1, b"team"), ld(2, b"a")].concat());
    let metadata = [ld(1, b"shop"), ld(3, b""), zero_time, label].concat();
    let body = envelope(
        b"v1",
        b"Namespace",
        &[ld(1, &metadata), ld(2, &[])].concat(),
    );
    assert_eq!(
        decode(&body).unwrap(),
        json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "shop", "labels": {"team": "a"}},
            "spec": {},
        })
    );
}

#[test]
fn a_secret_keeps_its_bytes_as_base64() {
    let entry = ld(2, &[ld(1, b"password"), ld(2, b"s3cret")].concat());
    let body = envelope(
        b"v1",
        b"Secret",
        &[ld(1, &ld(1, b"db")), entry, ld(3, b"Opaque")].concat(),
    );
    assert_eq!(
        decode(&body).unwrap(),
        json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "db"},
            "data": {"password": "czNjcmV0"},
            "type": "Opaque",
        })
    );
}

#[test]
fn an_access_review_reads_its_attributes() {
    let attributes = [ld(1, b"default"), ld(2, b"delete"), ld(5, b"pods")].concat();
    let body = envelope(
        b"authorization.k8s.io/v1",
        b"SelfSubjectAccessReview",
        &ld(2, &ld(1, &attributes)),
    );
    let review = decode(&body).unwrap();
    assert_eq!(
        review["spec"]["resourceAttributes"],
        json!({"namespace": "default", "verb": "delete", "resource": "pods"})
    );
}

#[test]
fn answers_encode_and_read_back_unchanged() {
    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "web", "namespace": "shop", "uid": "u-1", "resourceVersion": "42",
            "generation": 3, "creationTimestamp": "2026-11-26T06:00:00Z",
            "labels": {"app": "web"},
        },
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "web"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": 1}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{
                    "name": "nginx", "image": "nginx:1.27",
                    "ports": [{"containerPort": 80, "protocol": "TCP"}],
                    "resources": {"limits": {"cpu": "500m", "memory": "128Mi"}},
                    "livenessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 5},
                    "env": [{"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}}],
                }],
                "volumes": [{"name": "scratch", "emptyDir": {}}]},
            },
        },
        "status": {"replicas": 2, "readyReplicas": 2},
    });
    let bytes = encode(&deployment).unwrap().unwrap();
    assert!(bytes.starts_with(b"k8s\0"));
    assert_eq!(decode(&bytes).unwrap(), deployment);
}

#[test]
fn a_status_is_meta_s_and_unknown_kinds_stay_json() {
    let failure = json!({
        "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
        "message": "namespaces \"x\" not found", "reason": "NotFound",
        "details": {"name": "x", "kind": "namespaces"}, "code": 404,
    });
    let bytes = encode(&failure).unwrap().unwrap();
    assert_eq!(decode(&bytes).unwrap(), failure);
    let table = json!({"apiVersion": "meta.k8s.io/v1", "kind": "Table"});
    assert!(encode(&table).is_none());
}

#[test]
fn a_bad_body_says_what_is_wrong() {
    assert!(decode(b"{}").unwrap_err().contains("k8s\\0"));
    let widget = envelope(b"example.com/v1", b"Widget", &[]);
    assert!(decode(&widget).unwrap_err().contains("send it as JSON"));
    let wrong = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": 1}});
    assert!(
        encode(&wrong)
            .unwrap()
            .unwrap_err()
            .contains("ConfigMap.data")
    );
}

#[test]
fn protobuf_is_answered_only_to_who_prefers_it() {
    assert!(preferred(Some("application/vnd.kubernetes.protobuf, */*")));
    assert!(preferred(Some(
        "application/vnd.kubernetes.protobuf,application/json"
    )));
    assert!(!preferred(Some(
        "application/json, application/vnd.kubernetes.protobuf"
    )));
    assert!(!preferred(Some(
        "application/vnd.kubernetes.protobuf;stream=watch"
    )));
    assert!(!preferred(None));
}
