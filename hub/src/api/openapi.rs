//! `GET /v1/openapi.json`: the API described as OpenAPI 3.0, built from the same Rust types the
//! handlers parse and return, and from the same kind table the router serves, so the document
//! cannot drift from the server.

use schemars::{SchemaGenerator, generate::SchemaSettings};
use serde_json::{Map, Value, json};

use super::{DeviceLoginRequest, DevicePoll, LoginRequest, ProviderTest, error::StatusBody};
use crate::{
    model::{Kind, State, Status},
    store::ObjectMeta,
};

fn reference(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn error_responses(codes: &[u16]) -> Map<String, Value> {
    codes
        .iter()
        .map(|code| {
            let description = match code {
                400 => "The request cannot be parsed; the message says what to fix",
                401 => "No valid credential; log in",
                403 => "The caller's roles do not allow this",
                404 => "No such object",
                409 => "Already exists, or changed since it was read (resend with the current resourceVersion)",
                410 => "The resourceVersion is too old to watch from; list again",
                422 => "The object is not valid; the message names the field",
                413 => "The body is larger than the API takes, or a list has more items than are created at once; send less at a time",
                429 => "Too many failed logins; retry after the given time",
                _ => "Error",
            };
            (
                code.to_string(),
                json!({"description": description, "content": {"application/json": {"schema": reference("Status")}}}),
            )
        })
        .collect()
}

fn json_body(schema: Value) -> Value {
    json!({"required": true, "content": {"application/json": {"schema": schema}}})
}

fn ok(description: &str, schema: Value) -> Value {
    json!({"description": description, "content": {"application/json": {"schema": schema}}})
}

fn responses(success: (&str, Value), errors: &[u16]) -> Value {
    let mut map = error_responses(errors);
    map.insert(success.0.to_owned(), success.1);
    Value::Object(map)
}

/// The whole document.
pub fn document() -> Value {
    let mut generator = SchemaGenerator::new(SchemaSettings::openapi3());
    let mut schemas = Map::new();
    generator.subschema_for::<ObjectMeta>();
    generator.subschema_for::<Status>();
    generator.subschema_for::<State>();
    generator.subschema_for::<StatusBody>();
    generator.subschema_for::<LoginRequest>();
    generator.subschema_for::<ProviderTest>();
    generator.subschema_for::<DeviceLoginRequest>();
    generator.subschema_for::<DevicePoll>();
    generator.subschema_for::<proto::register::RegisterRequest>();
    generator.subschema_for::<proto::overview::Overview>();
    let mut paths = Map::new();
    for kind in Kind::ALL {
        let name = kind.name();
        let spec = kind.spec_schema(&mut generator);
        schemas.insert(
            name.to_owned(),
            json!({
                "type": "object",
                "required": ["apiVersion", "kind", "metadata", "spec", "status", "state"],
                "properties": {
                    "apiVersion": {"type": "string", "enum": [super::API_VERSION]},
                    "kind": {"type": "string", "enum": [name]},
                    "metadata": reference("ObjectMeta"),
                    "spec": spec,
                    "status": reference("Status"),
                    "state": reference("State"),
                },
            }),
        );
        schemas.insert(
            format!("{name}List"),
            json!({
                "type": "object",
                "required": ["apiVersion", "kind", "metadata", "items"],
                "properties": {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string", "enum": [format!("{name}List")]},
                    "metadata": {"type": "object", "properties": {
                        "resourceVersion": {"type": "string"},
                        "continue": {"type": "string"},
                        "remainingItemCount": {"type": "integer", "minimum": 0},
                    }},
                    "items": {"type": "array", "items": reference(name)},
                },
            }),
        );
        // The hub names tokens itself (the name is half of the secret's lookup).
        let required = match kind {
            Kind::Token | Kind::RegistrationToken => json!(["spec"]),
            _ => json!(["metadata", "spec"]),
        };
        let input = json!({
            "type": "object",
            "required": required,
            "properties": {
                "metadata": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "pattern": "^[a-z]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
                        "resourceVersion": {"type": "string", "pattern": "^[0-9]*$"},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                        "finalizers": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "spec": kind.spec_schema(&mut generator),
            },
        });
        let plural = kind.plural();
        let name_param =
            json!({"name": "name", "in": "path", "required": true, "schema": {"type": "string"}});
        paths.insert(
            format!("/v1/{plural}"),
            json!({
                "get": {
                    "operationId": format!("list{name}"),
                    "summary": format!("List {plural} (or watch them with watch=true: text/event-stream)"),
                    "parameters": [
                        {"name": "labelSelector", "in": "query", "schema": {"type": "string"}},
                        {"name": "watch", "in": "query", "schema": {"type": "boolean"}},
                        {"name": "resourceVersion", "in": "query", "schema": {"type": "string", "pattern": "^[0-9]*$"}},
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 0},
                         "description": "at most this many items, in name order (0: all); `metadata.continue` then names the next page"},
                        {"name": "continue", "in": "query", "schema": {"type": "string"},
                         "description": "the previous page's `metadata.continue`"},
                    ],
                    "responses": {
                        "200": {
                            "description": format!("The {plural} the caller may see"),
                            "content": {
                                "application/json": {"schema": reference(&format!("{name}List"))},
                                // One server-sent event: `event` is the change's type, `data` is
                                // {"type", "object"} as JSON.
                                "text/event-stream": {"schema": {
                                    "type": "object",
                                    "required": ["data"],
                                    "properties": {
                                        "event": {"type": "string", "enum": ["ADDED", "MODIFIED", "DELETED", "ERROR"]},
                                        "data": {"type": "string"},
                                    },
                                }},
                            },
                        },
                        "400": error_responses(&[400])["400"],
                        "401": error_responses(&[401])["401"],
                        "404": error_responses(&[404])["404"],
                        "410": error_responses(&[410])["410"],
                    },
                },
                // One object, or a list of them created together (all or none).
                "post": {
                    "operationId": format!("create{name}"),
                    "requestBody": json_body(json!({"oneOf": [input.clone(), {
                        "type": "object",
                        "required": ["kind", "items"],
                        "properties": {
                            "kind": {"type": "string", "enum": [format!("{name}List"), "List"]},
                            "items": {"type": "array", "maxItems": super::objects::MAX_CREATED_AT_ONCE, "items": input.clone()},
                        },
                    }]})),
                    "responses": responses(
                        ("201", ok("Created (a list: every item, in order)", json!({"oneOf": [reference(name), reference(&format!("{name}List"))]}))),
                        &[400, 401, 403, 404, 409, 413, 422],
                    ),
                },
            }),
        );
        paths.insert(
            format!("/v1/{plural}/{{name}}"),
            json!({
                "parameters": [name_param],
                "get": {
                    "operationId": format!("get{name}"),
                    "responses": responses(("200", ok("The object", reference(name))), &[401, 403, 404]),
                },
                "put": {
                    "operationId": format!("replace{name}"),
                    "requestBody": json_body(input),
                    "responses": responses(("200", ok("Replaced", reference(name))), &[400, 401, 403, 404, 409, 413, 422]),
                },
                "patch": {
                    "operationId": format!("patch{name}"),
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object"}}}},
                    "responses": responses(("200", ok("Patched (JSON merge patch)", reference(name))), &[400, 401, 403, 404, 409, 413, 422]),
                },
                "delete": {
                    "operationId": format!("delete{name}"),
                    "parameters": [{"name": "resourceVersion", "in": "query", "schema": {"type": "integer", "minimum": 0}}],
                    "responses": responses(("200", ok("Deleted, or marked for deletion while finalizers remain", reference(name))), &[400, 401, 403, 404, 409]),
                },
            }),
        );
    }
    paths.insert(
        "/v1/login".into(),
        json!({"post": {
            "operationId": "login",
            "security": [],
            "requestBody": json_body(reference("LoginRequest")),
            "responses": responses(("200", ok("A token (and, for sessions, a cookie)", json!({
                "type": "object",
                "required": ["token", "expiresAt", "user"],
                "properties": {"token": {"type": "string"}, "expiresAt": {"type": "string"}, "user": {"type": "string"}},
            }))), &[400, 401, 429]),
        }}),
    );
    paths.insert(
        "/v1/login/providers".into(),
        json!({"get": {
            "operationId": "loginProviders",
            "summary": "What the login page offers: the hub's own users and each enabled auth provider",
            "security": [],
            "responses": responses(("200", ok("The providers", json!({
                "type": "object",
                "required": ["items"],
                "properties": {"items": {"type": "array", "items": {
                    "type": "object",
                    "required": ["name", "type", "displayName"],
                    "properties": {"name": {"type": "string"}, "type": {"type": "string"}, "displayName": {"type": "string"}},
                }}},
            }))), &[]),
        }}),
    );
    let provider_param =
        json!([{"name": "provider", "in": "path", "required": true, "schema": {"type": "string"}}]);
    paths.insert(
        "/v1/login/{provider}/start".into(),
        json!({"get": {
            "operationId": "startProviderLogin",
            "summary": "A browser's sign-in at an OpenID provider: redirects there (a cookie binds the login to this browser)",
            "security": [],
            "parameters": [provider_param[0], {"name": "next", "in": "query", "schema": {"type": "string"}, "description": "a path on this hub to go to afterwards"}],
            "responses": {"303": {"description": "To the provider's authorization endpoint, or back to /login with the error"}},
        }}),
    );
    paths.insert(
        "/v1/login/{provider}/device".into(),
        json!({"post": {
            "operationId": "startDeviceLogin",
            "summary": "The command line's sign-in with a provider (RFC 8628's shape): a code to show and a page to open; once a person signed in there types the code and confirms, the token the CLI made works",
            "security": [],
            "parameters": provider_param,
            "requestBody": json_body(reference("DeviceLoginRequest")),
            "responses": responses(("200", ok("What to show, and what to poll with", json!({
                "type": "object",
                "required": ["deviceCode", "userCode", "verificationUri", "expiresIn", "interval"],
                "properties": {"deviceCode": {"type": "string"}, "userCode": {"type": "string"},
                               "verificationUri": {"type": "string"}, "expiresIn": {"type": "integer"},
                               "interval": {"type": "integer"}},
            }))), &[400, 404, 422, 429, 503]),
        }}),
    );
    paths.insert(
        "/v1/login/device/token".into(),
        json!({"post": {
            "operationId": "pollDeviceLogin",
            "summary": "Whether the command line's sign-in was confirmed: 200 with the user once it was; else 400 with error authorization_pending, access_denied or expired_token",
            "security": [],
            "requestBody": json_body(reference("DevicePoll")),
            "responses": {
                "200": ok("Confirmed: the CLI's token works", json!({
                    "type": "object", "required": ["user"], "properties": {"user": {"type": "string"}},
                })),
                "400": {"description": "Not (yet) confirmed", "content": {"application/json": {"schema": {
                    "type": "object", "required": ["error", "message"],
                    "properties": {"error": {"type": "string"}, "message": {"type": "string"}},
                }}}},
            },
        }}),
    );
    paths.insert(
        "/v1/login/{provider}/callback".into(),
        json!({"get": {
            "operationId": "providerCallback",
            "summary": "Where the provider sends the browser back (code and state)",
            "security": [],
            "parameters": [provider_param[0], {"name": "code", "in": "query", "schema": {"type": "string"}}, {"name": "state", "in": "query", "schema": {"type": "string"}}],
            "responses": {"200": {"description": "Signed in: a page that moves on to where the login started"}, "303": {"description": "To /login, with the error"}},
        }}),
    );
    paths.insert(
        "/v1/authproviders/{name}/test".into(),
        json!({"post": {
            "operationId": "testAuthProvider",
            "summary": "Checks a provider's settings step by step (connect, bind, user, groups) and says which failed (admins only)",
            "parameters": [{"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}],
            "requestBody": {"required": false, "content": {"application/json": {"schema": reference("ProviderTest")}}},
            "responses": responses(("200", ok("What was found, or the step that failed", json!({
                "type": "object",
                "required": ["ok", "message"],
                "properties": {
                    "ok": {"type": "boolean"}, "step": {"type": "string"}, "message": {"type": "string"},
                    "user": {"type": "object"}, "groups": {"type": "array", "items": {"type": "string"}},
                    "allowed": {"type": "boolean"},
                },
            }))), &[400, 401, 403, 404, 422]),
        }}),
    );
    paths.insert(
        "/v1/logout".into(),
        json!({"post": {"operationId": "logout", "responses": {"204": {"description": "Logged out"}, "401": error_responses(&[401])["401"]}}}),
    );
    paths.insert(
        "/v1/me".into(),
        json!({"get": {"operationId": "me", "responses": responses(("200", ok("The caller and their roles", json!({
            "type": "object",
            "required": ["user", "admin", "clusters"],
            "properties": {"user": {"type": "string"}, "admin": {"type": "boolean"}, "clusters": {"type": "object", "additionalProperties": {"type": "string"}}},
        }))), &[401])}}),
    );
    paths.insert(
        "/v1/audit".into(),
        json!({"get": {
            "operationId": "auditLog",
            "summary": "The audit log's records, oldest first (admins only)",
            "parameters": [
                {"name": "user", "in": "query", "schema": {"type": "string"}},
                {"name": "cluster", "in": "query", "schema": {"type": "string"}},
                {"name": "since", "in": "query", "schema": {"type": "string"}, "description": "RFC 3339: records at or after it"},
                {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1}, "description": "the newest this many (1,000 by default)"},
            ],
            "responses": responses(("200", ok("The records", json!({
                "type": "object",
                "required": ["items"],
                "properties": {"items": {"type": "array", "items": {
                    "type": "object",
                    "required": ["time", "requestId", "user", "source", "verb", "method", "path", "code"],
                    "properties": {
                        "time": {"type": "string"}, "requestId": {"type": "string"},
                        "user": {"type": "string"}, "groups": {"type": "array", "items": {"type": "string"}},
                        "provider": {"type": "string"}, "source": {"type": "string"},
                        "verb": {"type": "string"}, "method": {"type": "string"}, "path": {"type": "string"},
                        "cluster": {"type": "string"}, "resource": {"type": "string"}, "name": {"type": "string"},
                        "code": {"type": "integer"},
                    },
                }}},
            }))), &[400, 401, 403, 404]),
        }}),
    );
    paths.insert(
        "/v3/register".into(),
        json!({"post": {
            "operationId": "registerAgent",
            "summary": "Exchange a registration token (as the bearer) for an agent credential",
            "requestBody": json_body(reference("RegisterRequest")),
            "responses": responses(("201", ok("The agent's credential, shown once", json!({
                "type": "object",
                "required": ["credential", "id", "cluster"],
                "properties": {"credential": {"type": "string"}, "id": {"type": "string"}, "cluster": {"type": "string"}},
            }))), &[400, 401, 404, 422]),
        }}),
    );
    let name_param = |name: &str| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}});
    let session = json!({
        "type": "object",
        "required": ["id", "user", "cluster", "namespace", "pod", "subresource", "startedAt", "inputRecorded"],
        "properties": {
            "id": {"type": "string"}, "user": {"type": "string"},
            "groups": {"type": "array", "items": {"type": "string"}},
            "cluster": {"type": "string"}, "namespace": {"type": "string"}, "pod": {"type": "string"},
            "container": {"type": "string"}, "command": {"type": "array", "items": {"type": "string"}},
            "subresource": {"type": "string", "enum": ["exec", "attach"]},
            "protocol": {"type": "string"}, "auditId": {"type": "string"},
            "startedAt": {"type": "string"}, "endedAt": {"type": "string"},
            "bytes": {"type": "integer"}, "inputRecorded": {"type": "boolean"},
            "truncated": {"type": "boolean"}, "notRecorded": {"type": "string"},
        },
    });
    paths.insert(
        "/v1/recordings".into(),
        json!({"get": {
            "operationId": "listRecordings",
            "summary": "Shell sessions recorded (every exec and attach through the hub), newest first; admins or a global role that allows get recordings",
            "responses": responses(("200", ok("The sessions", json!({
                "type": "object", "required": ["items"],
                "properties": {"items": {"type": "array", "items": session.clone()}},
            }))), &[401, 403]),
        }}),
    );
    paths.insert(
        "/v1/recordings/{id}".into(),
        json!({"get": {
            "operationId": "getRecording",
            "summary": "One recorded session",
            "parameters": [name_param("id")],
            "responses": responses(("200", ok("The session", json!({
                "type": "object", "required": ["session"], "properties": {"session": session},
            }))), &[401, 403, 404]),
        }}),
    );
    paths.insert(
        "/v1/recordings/{id}/cast".into(),
        json!({"get": {
            "operationId": "getRecordingCast",
            "summary": "One session's recording as asciicast v2 (a JSON header line, then [seconds, code, data] lines)",
            "parameters": [name_param("id")],
            "responses": responses(("200", json!({"description": "The recording", "content": {"application/x-asciicast": {"schema": {"type": "string"}}}})), &[401, 403, 404]),
        }}),
    );
    let any_object = json!({"type": "object"});
    let usage = json!({"get": {
        "summary": "A machine's facts, latest usage and the last 24 h at one-minute resolution (kept in the hub's memory)",
        "responses": responses(("200", ok("state, facts, usage, resolutionSeconds, points", any_object.clone())), &[401, 403, 404]),
    }});
    let mut host_usage = usage.clone();
    host_usage["get"]["operationId"] = json!("hostUsage");
    host_usage["get"]["parameters"] = json!([name_param("host")]);
    paths.insert("/v1/hosts/{host}/usage".into(), host_usage);
    let mut node_usage = usage;
    node_usage["get"]["operationId"] = json!("nodeUsage");
    node_usage["get"]["parameters"] = json!([name_param("cluster"), name_param("node")]);
    paths.insert(
        "/v1/clusters/{cluster}/nodes/{node}/usage".into(),
        node_usage,
    );
    paths.insert(
        "/v1/clusters/{cluster}/nodes".into(),
        json!({"get": {
            "operationId": "listNodes",
            "summary": "The cluster's nodes as its node-agents report them",
            "parameters": [name_param("cluster")],
            "responses": responses(("200", ok("items", any_object.clone())), &[401, 403, 404]),
        }}),
    );
    let event_params: Vec<Value> = ["cluster", "host", "node"]
        .iter()
        .map(|p| json!({"name": p, "in": "query", "schema": {"type": "string"}}))
        .chain([
            json!({"name": "since", "in": "query", "schema": {"type": "integer"}}),
            json!({"name": "watch", "in": "query", "schema": {"type": "boolean"}}),
        ])
        .collect();
    paths.insert(
        "/v1/events".into(),
        json!({"get": {
            "operationId": "listEvents",
            "summary": "Recent events, oldest first (or, with watch=true, those and then each new one: text/event-stream)",
            "parameters": event_params,
            "responses": responses(("200", ok("items", any_object.clone())), &[400, 401]),
        }}),
    );
    // The rest of the hub's HTTP surface (its pages aside): what each path is for.
    let text = |what: &str| json!({"description": what, "content": {"text/plain": {"schema": {"type": "string"}}}});
    let public = json!([]);
    paths.insert(
        "/v1/clusters/{name}/kubeconfig".into(),
        json!({"post": {
            "operationId": "createKubeconfig",
            "summary": "A kubeconfig for the caller, reaching the cluster through the hub's proxy (with a new 90-day token)",
            "parameters": [name_param("name")],
            "responses": responses(("200", ok("The kubeconfig (YAML)", json!({"type": "string"}))), &[401, 403, 404]),
        }}),
    );
    paths.insert(
        "/v1/kubeconfig".into(),
        json!({"post": {
            "operationId": "createHubKubeconfig",
            "summary": "A kubeconfig for the caller, reaching the hub itself: kubectl then manages the hub's kinds as management.drover.io/v1 (with a new token of the caller's)",
            "responses": responses(("201", ok("The kubeconfig (YAML)", json!({"type": "string"}))), &[401]),
        }}),
    );
    paths.insert(
        "/v1/gitrepos/{name}/webhook".into(),
        json!({"post": {
            "operationId": "gitrepoWebhook",
            "summary": "A git host's push: the GitRepo is read at once. No token: X-Hub-Signature-256 (sha256=HMAC of the body with the GitRepo's webhookSecret) is the proof; any refusal is 404",
            "security": public,
            "parameters": [name_param("name"),
                {"name": "X-Hub-Signature-256", "in": "header", "required": true, "schema": {"type": "string"}}],
            "requestBody": {"content": {"application/json": {"schema": any_object.clone()}}},
            "responses": responses(("202", ok("Accepted", any_object.clone())), &[404, 429]),
        }}),
    );
    paths.insert(
        "/v1/clusters/{cluster}/cache/{resource}".into(),
        json!({"get": {
            "operationId": "listCached",
            "summary": "A list from the cluster-agent's watch-driven cache (for example namespaces, nodes, pods), as the caller may see it",
            "parameters": [name_param("cluster"), name_param("resource"),
                {"name": "namespace", "in": "query", "schema": {"type": "string"},
                 "description": "one namespace, or several (comma-separated or repeated); every namespace when absent"},
                {"name": "labelSelector", "in": "query", "schema": {"type": "string"},
                 "description": "`drover.io/project=P` on namespaces is answered to P's members, who may not list namespaces"},
                {"name": "name", "in": "query", "schema": {"type": "string"},
                 "description": "names containing this text, ignoring case"},
                {"name": "sort", "in": "query", "schema": {"type": "string"},
                 "description": "a column of the kind's Table (`Status`, `Restarts`, `Age`, ...) or `Namespace`; `-` first for descending; namespace and name order otherwise"},
                {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                {"name": "continue", "in": "query", "schema": {"type": "string"},
                 "description": "the previous page's `metadata.continue`"},
                {"name": "resourceVersion", "in": "query", "schema": {"type": "string"},
                 "description": "answer no older than this revision (504 if the cache has not reached it within 3 s)"}],
            "responses": responses(("200", ok("A Kubernetes list", any_object.clone())), &[401, 403, 404, 503]),
        }}),
    );
    paths.insert(
        "/v1/clusters/{cluster}/overview".into(),
        json!({"get": {
            "operationId": "clusterOverview",
            "summary": "The cluster at a glance, summed by the cluster-agent from its caches: CPU, memory and pods (allocatable, requested, limits), node, pod and deployment health, the latest warning events. For those who may list every node, pod, deployment and event of the cluster",
            "parameters": [name_param("cluster")],
            "responses": responses(("200", ok("The overview", reference("Overview"))), &[401, 403, 404, 503]),
        }}),
    );
    paths.insert(
        "/v1/clusters/{cluster}/nodes/{node}/drain".into(),
        json!({"post": {
            "operationId": "drainNode",
            "summary": "Cordons the node and evicts its pods (not DaemonSet or mirror pods) as the caller, pass after pass, until it is empty, the cluster refuses a step, or timeoutSeconds (default 60, at most 600) pass",
            "parameters": [name_param("cluster"), name_param("node"),
                {"name": "timeoutSeconds", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 600}}],
            "responses": responses(("200", ok("A Kubernetes Status: drained", any_object.clone())), &[401, 403, 404, 503, 504]),
        }}),
    );
    let proxied = json!({
        "summary": "The cluster's Kubernetes API, as the caller (impersonated); `path` is any path the API server serves, watches and exec/attach/port-forward upgrades included",
        "parameters": [name_param("cluster"), name_param("path")],
        "responses": {"default": {"description": "The API server's answer"}},
    });
    paths.insert(
        "/k8s/clusters/{cluster}/{path}".into(),
        json!({"get": proxied, "post": proxied, "put": proxied, "patch": proxied, "delete": proxied}),
    );
    paths.insert(
        "/v1/openapi.json".into(),
        json!({"get": {"operationId": "openapi", "security": public, "responses": {"200": {"description": "This document"}}}}),
    );
    for (path, id, what) in [
        ("/healthz", "healthz", "ok while the process serves"),
        (
            "/readyz",
            "readyz",
            "ok when the store answers; else 503 and why",
        ),
        (
            "/cacerts",
            "cacerts",
            "The hub's CA (PEM); agents pin its sha256",
        ),
        ("/metrics", "metrics", "Prometheus text"),
        (
            "/system-agent-install.sh",
            "installScript",
            "The host install script",
        ),
    ] {
        let mut responses = json!({"200": text(what)});
        if path == "/readyz" {
            responses["503"] = text("not ready: why");
        }
        paths.insert(
            path.into(),
            json!({"get": {"operationId": id, "security": public, "responses": responses}}),
        );
    }
    paths.insert(
        "/v3/import/{file}".into(),
        json!({"get": {
            "operationId": "importManifest",
            "summary": "The manifest that installs the agents into an imported cluster; `file` is `<registration token>.yaml`, the token being the credential",
            "security": public,
            "parameters": [name_param("file")],
            "responses": {"200": {"description": "YAML", "content": {"application/yaml": {"schema": {"type": "string"}}}},
                          "404": error_responses(&[404])["404"]},
        }}),
    );
    paths.insert(
        "/v3/system-agent/{arch}".into(),
        json!({"get": {"operationId": "systemAgentBinary", "security": public,
            "parameters": [name_param("arch")],
            "responses": {"200": {"description": "The drover-system-agent binary for `arch` (amd64, arm64)"}, "404": error_responses(&[404])["404"]}}}),
    );
    paths.insert(
        "/v3/artifacts/{version}/{file}".into(),
        json!({"get": {"operationId": "artifact", "security": public,
            "parameters": [name_param("version"), name_param("file")],
            "responses": {"200": {"description": "An air-gap artifact of a distribution version"}, "404": error_responses(&[404])["404"]}}}),
    );
    paths.insert(
        "/v3/connect".into(),
        json!({"get": {"operationId": "agentTunnel",
            "summary": "An agent's tunnel: a WebSocket upgrade, authenticated by the agent's credential",
            "responses": {"101": {"description": "Switching to the tunnel"}, "401": error_responses(&[401])["401"]}}}),
    );
    paths.insert(
        "/v3/relay/{kind}/{cluster}/{service}/{path}".into(),
        json!({"get": {"operationId": "relay",
            "summary": "Between hub replicas only (mutual TLS): a request for an agent connected to this replica",
            "parameters": [name_param("kind"), name_param("cluster"), name_param("service"), name_param("path")],
            "responses": {"default": {"description": "The agent's answer"}}}}),
    );
    let mut definitions = generator.take_definitions(true);
    // The error body is called Status in Kubernetes; the object status is ObjectStatus here.
    if let Some(status) = definitions.remove("Status") {
        definitions.insert("ObjectStatus".into(), status);
    }
    if let Some(body) = definitions.remove("StatusBody") {
        definitions.insert("Status".into(), body);
    }
    for schema in schemas.values_mut() {
        if let Some(status) = schema.pointer_mut("/properties/status") {
            *status = reference("ObjectStatus");
        }
    }
    definitions.extend(schemas);
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "Drover hub API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Kube-shaped objects under /v1. Authenticate with Authorization: Bearer <token> (from /v1/login) or the dashboard's session cookie.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}, {"session": []}],
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "session": {"type": "apiKey", "in": "cookie", "name": crate::auth::SESSION_COOKIE},
            },
            "schemas": definitions,
        },
        "paths": paths,
    })
}

/// Every `$ref` in `value` that points nowhere in `document` (empty when the document holds).
pub fn dangling_refs(document: &Value) -> Vec<String> {
    fn walk(value: &Value, document: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(target)) = map.get("$ref") {
                    let resolves = target
                        .strip_prefix('#')
                        .is_some_and(|p| document.pointer(p).is_some());
                    if !resolves {
                        out.push(target.clone());
                    }
                }
                map.values().for_each(|v| walk(v, document, out));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, document, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(document, document, &mut out);
    out
}

/// Checks `value` against `schema` (the subset of JSON Schema the document uses: `$ref`,
/// `type` with `nullable`, `enum`, `const`, `required`, `properties`, `additionalProperties`,
/// `items`, `anyOf`/`oneOf`/`allOf`). Returns where and why it does not conform.
pub fn conformance(
    document: &Value,
    schema: &Value,
    value: &Value,
    at: &str,
) -> Result<(), String> {
    let Some(schema) = schema.as_object() else {
        return Ok(());
    };
    if let Some(Value::String(target)) = schema.get("$ref") {
        let resolved = target
            .strip_prefix('#')
            .and_then(|p| document.pointer(p))
            .ok_or_else(|| format!("{at}: dangling $ref {target}"))?;
        return conformance(document, resolved, value, at);
    }
    if value.is_null() && schema.get("nullable") == Some(&Value::Bool(true)) {
        return Ok(());
    }
    if let Some(Value::Array(options)) = schema.get("enum")
        && !options.contains(value)
    {
        return Err(format!("{at}: {value} is not one of {options:?}"));
    }
    if let Some(expected) = schema.get("const")
        && expected != value
    {
        return Err(format!("{at}: {value} is not {expected}"));
    }
    if let Some(Value::String(kind)) = schema.get("type") {
        let ok = match kind.as_str() {
            "object" => value.is_object(),
            "array" => value.is_array(),
            "string" => value.is_string(),
            "boolean" => value.is_boolean(),
            "integer" => value.is_i64() || value.is_u64(),
            "number" => value.is_number(),
            "null" => value.is_null(),
            _ => true,
        };
        if !ok {
            return Err(format!("{at}: {value} is not of type {kind}"));
        }
    }
    for key in ["allOf"] {
        if let Some(Value::Array(all)) = schema.get(key) {
            for s in all {
                conformance(document, s, value, at)?;
            }
        }
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(any)) = schema.get(key)
            && !any
                .iter()
                .any(|s| conformance(document, s, value, at).is_ok())
        {
            return Err(format!("{at}: {value} matches none of the {key} schemas"));
        }
    }
    if let Value::Object(object) = value {
        if let Some(Value::Array(required)) = schema.get("required") {
            for field in required.iter().filter_map(Value::as_str) {
                if !object.contains_key(field) {
                    return Err(format!("{at}: required field {field:?} is missing"));
                }
            }
        }
        let properties = schema.get("properties").and_then(Value::as_object);
        for (field, v) in object {
            match properties.and_then(|p| p.get(field)) {
                Some(s) => conformance(document, s, v, &format!("{at}.{field}"))?,
                None => match schema.get("additionalProperties") {
                    Some(Value::Bool(false)) => {
                        return Err(format!("{at}: unexpected field {field:?}"));
                    }
                    Some(s @ Value::Object(_)) => {
                        conformance(document, s, v, &format!("{at}.{field}"))?
                    }
                    _ => {}
                },
            }
        }
    }
    if let (Value::Array(items), Some(item_schema)) = (value, schema.get("items")) {
        for (i, item) in items.iter().enumerate() {
            conformance(document, item_schema, item, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}
