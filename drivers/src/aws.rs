//! AWS's Query API (EC2, IAM, and the clouds that speak it): form-encoded POSTs signed with
//! Signature Version 4, answered with XML. Only TLS: the endpoint's certificate is checked
//! against the system's roots, or against a CA given for a private cloud.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use ring::{digest, hmac};
use rustls_pki_types::{CertificateDer, ServerName, pem::PemObject};
use tokio::net::TcpStream;

use crate::xml::Element;

/// An access key. The secret is never printed.
#[derive(Clone)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, …)", self.access_key_id)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AwsError {
    /// The service answered with an error (`Code`: what AWS calls it).
    #[error("{action}: {code}: {message}")]
    Service {
        action: String,
        code: String,
        message: String,
        status: u16,
    },
    #[error("{0}: cannot reach the endpoint: {1}")]
    Unreachable(String, String),
    #[error("{0}: no answer within {1:?}")]
    Timeout(String, Duration),
    #[error("{0}: the answer is not the XML expected: {1}")]
    Malformed(String, String),
    #[error("endpoint {0:?}: {1}")]
    Endpoint(String, String),
}

/// One service at one endpoint, e.g. EC2 in `eu-west-1`.
#[derive(Clone)]
pub struct Client {
    host: String,
    port: u16,
    path: String,
    region: String,
    service: String,
    version: String,
    credentials: Credentials,
    tls: Arc<rustls::ClientConfig>,
    timeout: Duration,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Client({} {} at {}:{})",
            self.service, self.region, self.host, self.port
        )
    }
}

impl Client {
    /// `endpoint`: `https://HOST[:PORT][/PATH]`; `ca_pem`: trust these CAs instead of the
    /// system's (a private cloud's, or a test's).
    pub fn new(
        endpoint: &str,
        region: &str,
        service: &str,
        version: &str,
        credentials: Credentials,
        ca_pem: Option<&str>,
    ) -> Result<Self, AwsError> {
        let bad = |why: &str| AwsError::Endpoint(endpoint.to_owned(), why.to_owned());
        let rest = endpoint
            .strip_prefix("https://")
            .ok_or_else(|| bad("must start with https://"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].to_owned()),
            None => (rest, "/".to_owned()),
        };
        let port_of = |p: Option<&str>| -> Result<u16, AwsError> {
            p.map_or(Ok(443), |p| {
                p.parse().map_err(|_| bad("the port is not a number"))
            })
        };
        let (host, port) = match authority.strip_prefix('[') {
            Some(v6) => {
                let (h, rest) = v6.split_once(']').ok_or_else(|| bad("an unclosed ["))?;
                (h.to_owned(), port_of(rest.strip_prefix(':'))?)
            }
            None => {
                let (h, p) = match authority.split_once(':') {
                    Some((h, p)) => (h, Some(p)),
                    None => (authority, None),
                };
                (h.to_owned(), port_of(p)?)
            }
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let mut roots = rustls::RootCertStore::empty();
        match ca_pem {
            Some(pem) => {
                for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                    let cert = cert.map_err(|e| bad(&format!("its CA: {e}")))?;
                    roots.add(cert).map_err(|e| bad(&format!("its CA: {e}")))?;
                }
                if roots.is_empty() {
                    return Err(bad("its CA holds no certificate"));
                }
            }
            None => {
                roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            }
        }
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(&e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(Client {
            host,
            port,
            path,
            region: region.to_owned(),
            service: service.to_owned(),
            version: version.to_owned(),
            credentials,
            tls: Arc::new(tls),
            timeout: Duration::from_secs(30),
        })
    }

    /// Calls `action` with `params` and returns the answer's root element.
    pub async fn call(
        &self,
        action: &str,
        params: &[(String, String)],
    ) -> Result<Element, AwsError> {
        // (The serializer is not Send: made and finished before anything awaits.)
        let body = {
            let mut form = form_urlencoded::Serializer::new(String::new());
            form.append_pair("Action", action);
            form.append_pair("Version", &self.version);
            for (k, v) in params {
                form.append_pair(k, v);
            }
            form.finish()
        };
        let host_header = self.host_header();
        let now = time::OffsetDateTime::now_utc();
        let authorization = sign(&Request {
            method: "POST",
            path: &self.path,
            query: "",
            headers: &[
                ("content-type", "application/x-www-form-urlencoded"),
                ("host", &host_header),
                ("x-amz-date", &amz_date(now)),
            ],
            body: body.as_bytes(),
            region: &self.region,
            service: &self.service,
            credentials: &self.credentials,
        });
        let request = http::Request::post(&self.path)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("host", &host_header)
            .header("x-amz-date", amz_date(now))
            .header("authorization", authorization)
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| AwsError::Endpoint(self.host.clone(), e.to_string()))?;
        let (status, _, answer) = tokio::time::timeout(self.timeout, self.send(action, request))
            .await
            .map_err(|_| AwsError::Timeout(action.to_owned(), self.timeout))??;
        let text = String::from_utf8_lossy(&answer);
        let root = crate::xml::parse(&text)
            .map_err(|e| AwsError::Malformed(action.to_owned(), format!("{e} (HTTP {status})")))?;
        if (200..300).contains(&status) {
            return Ok(root);
        }
        // EC2: <Response><Errors><Error><Code/><Message/>; IAM: <ErrorResponse><Error>….
        let error = root
            .find("Errors")
            .and_then(|e| e.find("Error"))
            .or_else(|| root.find("Error"));
        Err(AwsError::Service {
            action: action.to_owned(),
            code: error
                .map(|e| e.text_of("Code"))
                .unwrap_or_default()
                .to_owned(),
            message: error
                .map(|e| e.text_of("Message"))
                .unwrap_or_default()
                .to_owned(),
            status,
        })
    }

    /// Calls a REST-JSON service (EKS): `method` on `path` (below the endpoint's own path,
    /// starting with `/`, its segments already URI-safe) with `query`'s pairs and `body` as
    /// JSON. `action` names the call in errors. A 404's answer is an error like any other:
    /// [`AwsError::not_found`] tells it.
    pub async fn rest(
        &self,
        action: &str,
        method: &str,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&serde_json::Value>,
    ) -> Result<serde_json::Value, AwsError> {
        let full_path = format!("{}{path}", self.path.trim_end_matches('/'));
        let canonical_query = canonical_query(query);
        let body = body.map(serde_json::Value::to_string).unwrap_or_default();
        let host_header = self.host_header();
        let now = amz_date(time::OffsetDateTime::now_utc());
        let mut headers = vec![("host", host_header.as_str()), ("x-amz-date", now.as_str())];
        if !body.is_empty() {
            headers.push(("content-type", "application/json"));
        }
        let authorization = sign(&Request {
            method,
            path: &full_path,
            query: &canonical_query,
            headers: &headers,
            body: body.as_bytes(),
            region: &self.region,
            service: &self.service,
            credentials: &self.credentials,
        });
        let uri = if canonical_query.is_empty() {
            full_path
        } else {
            format!("{full_path}?{canonical_query}")
        };
        let mut request = http::Request::builder().method(method).uri(uri);
        for (name, value) in &headers {
            request = request.header(*name, *value);
        }
        let request = request
            .header("authorization", authorization)
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| AwsError::Endpoint(self.host.clone(), e.to_string()))?;
        let (status, headers, answer) =
            tokio::time::timeout(self.timeout, self.send(action, request))
                .await
                .map_err(|_| AwsError::Timeout(action.to_owned(), self.timeout))??;
        let parsed = if answer.is_empty() {
            Ok(serde_json::Value::Null)
        } else {
            serde_json::from_slice::<serde_json::Value>(&answer)
        };
        let json = match parsed {
            Ok(json) if (200..300).contains(&status) => return Ok(json),
            Ok(json) => json,
            Err(e) if (200..300).contains(&status) => {
                return Err(AwsError::Malformed(
                    action.to_owned(),
                    format!("not JSON: {e} (HTTP {status})"),
                ));
            }
            // A refusal in the Query APIs' XML (an authentication layer shared with them), or
            // from something in front of the service: its code and message, else its text.
            Err(_) => {
                let text = String::from_utf8_lossy(&answer);
                let xml = crate::xml::parse(&text).ok();
                let error = xml.as_ref().and_then(|root| root.descendant("Error"));
                match error {
                    Some(error) => serde_json::json!({
                        "__type": error.text_of("Code"), "message": error.text_of("Message"),
                    }),
                    None => serde_json::json!({
                        "message": text.chars().take(300).collect::<String>()
                    }),
                }
            }
        };
        // `x-amzn-ErrorType: ResourceNotFoundException:http://internal.amazon.com/…`.
        let code = headers
            .get("x-amzn-errortype")
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(':').next().unwrap_or_default().to_owned())
            .or_else(|| {
                json.get("__type")
                    .and_then(|t| t.as_str())
                    .map(str::to_owned)
            })
            .unwrap_or_default();
        let message = ["message", "Message"]
            .iter()
            .find_map(|key| json.get(*key).and_then(|m| m.as_str()))
            .unwrap_or_default()
            .to_owned();
        Err(AwsError::Service {
            action: action.to_owned(),
            code,
            message,
            status,
        })
    }

    fn host_header(&self) -> String {
        if self.port == 443 {
            self.host.clone()
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    async fn send(
        &self,
        action: &str,
        request: http::Request<Full<Bytes>>,
    ) -> Result<(u16, http::HeaderMap, Bytes), AwsError> {
        let unreachable = |e: &dyn std::fmt::Display| {
            AwsError::Unreachable(
                action.to_owned(),
                format!("{}:{}: {e}", self.host, self.port),
            )
        };
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| unreachable(&e))?;
        let name = ServerName::try_from(self.host.clone()).map_err(|e| unreachable(&e))?;
        let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| unreachable(&e))?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .map_err(|e| unreachable(&e))?;
        let driver = tokio::spawn(connection);
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| unreachable(&e))?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| unreachable(&e))?
            .to_bytes();
        driver.abort();
        Ok((status, headers, body))
    }
}

/// A presigned GET of `https://{host}{path}?{query}` (Signature Version 4 in the query
/// string, as an SDK's presigner makes it): anyone holding the URL may make that one request,
/// with the `headers` signed, until `expires_secs` after `at`.
#[allow(clippy::too_many_arguments)]
pub fn presigned_get(
    host: &str,
    path: &str,
    query: &[(&str, &str)],
    headers: &[(&str, &str)],
    region: &str,
    service: &str,
    credentials: &Credentials,
    at: time::OffsetDateTime,
    expires_secs: u32,
) -> String {
    let date_time = amz_date(at);
    let scope = format!(
        "{}/{}/{region}/{service}/aws4_request",
        credentials.access_key_id,
        date_time.get(..8).unwrap_or_default()
    );
    let mut signed: Vec<(&str, &str)> = vec![("host", host)];
    signed.extend(headers.iter().copied());
    signed.sort_unstable();
    let signed_names = signed.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(";");
    let expires = expires_secs.to_string();
    let mut pairs: Vec<(&str, &str)> = query.to_vec();
    pairs.extend([
        ("X-Amz-Algorithm", "AWS4-HMAC-SHA256"),
        ("X-Amz-Credential", scope.as_str()),
        ("X-Amz-Date", date_time.as_str()),
        ("X-Amz-Expires", expires.as_str()),
        ("X-Amz-SignedHeaders", signed_names.as_str()),
    ]);
    let canonical = canonical_query(&pairs);
    let request = Request {
        method: "GET",
        path,
        query: &canonical,
        headers: &signed,
        body: b"",
        region,
        service,
        credentials,
    };
    let (_, _, signature) = signature(&request, &date_time);
    format!("https://{host}{path}?{canonical}&X-Amz-Signature={signature}")
}

/// SigV4's canonical query string: each key and value URI-encoded (unreserved characters
/// kept, a space as `%20`), the pairs sorted.
fn canonical_query(pairs: &[(&str, &str)]) -> String {
    let mut encoded: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (uri_encode(k), uri_encode(v)))
        .collect();
    encoded.sort();
    encoded
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// RFC 3986 encoding as SigV4 asks: every byte but `A-Z a-z 0-9 - _ . ~` as `%XX`.
fn uri_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

impl AwsError {
    /// Whether the service said the thing asked about does not exist.
    pub fn not_found(&self) -> bool {
        matches!(self, AwsError::Service { status: 404, .. })
            || matches!(self, AwsError::Service { code, .. } if code == "ResourceNotFoundException")
    }
}

/// `20150830T123600Z`.
fn amz_date(at: time::OffsetDateTime) -> String {
    format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second()
    )
}

/// What a signature covers. `headers`: lower-case names, each signed; `x-amz-date` among them.
struct Request<'a> {
    method: &'a str,
    path: &'a str,
    /// The canonical query string: `key=value` pairs, URI-encoded, sorted, joined by `&`.
    query: &'a str,
    headers: &'a [(&'a str, &'a str)],
    body: &'a [u8],
    region: &'a str,
    service: &'a str,
    credentials: &'a Credentials,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `Authorization` header of Signature Version 4.
fn sign(request: &Request<'_>) -> String {
    let date_time = request
        .headers
        .iter()
        .find(|(k, _)| *k == "x-amz-date")
        .map_or("", |(_, v)| *v);
    let (scope, signed_headers, signature) = signature(request, date_time);
    format!(
        "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
        request.credentials.access_key_id,
    )
}

/// Signature Version 4 of `request`: (credential scope, signed headers, signature).
/// `date_time`: when it is signed (`20150830T123600Z`).
fn signature(request: &Request<'_>, date_time: &str) -> (String, String, String) {
    let mut headers: Vec<(&str, &str)> = request.headers.to_vec();
    headers.sort_unstable();
    let date = date_time.get(..8).unwrap_or_default();
    let canonical_headers: String = headers
        .iter()
        .map(|(k, v)| format!("{k}:{}\n", v.trim()))
        .collect();
    let signed_headers = headers
        .iter()
        .map(|(k, _)| *k)
        .collect::<Vec<_>>()
        .join(";");
    let canonical_request = format!(
        "{}\n{}\n{}\n{canonical_headers}\n{signed_headers}\n{}",
        request.method,
        request.path,
        request.query,
        hex(digest::digest(&digest::SHA256, request.body).as_ref())
    );
    let scope = format!("{date}/{}/{}/aws4_request", request.region, request.service);
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{date_time}\n{scope}\n{}",
        hex(digest::digest(&digest::SHA256, canonical_request.as_bytes()).as_ref())
    );
    let mac = |key: &[u8], data: &str| {
        hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data.as_bytes())
    };
    let secret = format!("AWS4{}", request.credentials.secret_access_key);
    let key = mac(secret.as_bytes(), date);
    let key = mac(key.as_ref(), request.region);
    let key = mac(key.as_ref(), request.service);
    let key = mac(key.as_ref(), "aws4_request");
    let signature = mac(key.as_ref(), &string_to_sign);
    (scope, signed_headers, hex(signature.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signs_as_aws_test_suite_post_x_www_form_urlencoded() {
        // AWS's Signature Version 4 test suite, vector "post-x-www-form-urlencoded".
        let credentials = Credentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
        };
        let authorization = sign(&Request {
            method: "POST",
            path: "/",
            query: "",
            headers: &[
                ("x-amz-date", "20150830T123600Z"),
                ("host", "example.amazonaws.com"),
                ("content-type", "application/x-www-form-urlencoded"),
            ],
            body: b"Param1=value1",
            region: "us-east-1",
            service: "service",
            credentials: &credentials,
        });
        assert_eq!(
            authorization,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date, \
             Signature=ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a"
        );
    }

    fn example() -> Credentials {
        Credentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
        }
    }

    // The two signatures below are botocore's (`SigV4Auth` at 2015-08-30T12:36:00Z): an
    // implementation other than this one.
    #[test]
    fn signs_a_rest_get_with_its_query_as_botocore_does() {
        let authorization = sign(&Request {
            method: "GET",
            path: "/clusters/demo/node-groups",
            query: &canonical_query(&[("nextToken", "b"), ("maxResults", "100")]),
            headers: &[
                ("host", "example.amazonaws.com"),
                ("x-amz-date", "20150830T123600Z"),
            ],
            body: b"",
            region: "us-east-1",
            service: "eks",
            credentials: &example(),
        });
        assert_eq!(
            authorization,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/eks/aws4_request, \
             SignedHeaders=host;x-amz-date, \
             Signature=64e74452e7ce2ac656b2e291703566b541e1bb3476ad74daa0b88653d417c4c1"
        );
    }

    #[test]
    fn signs_a_rest_post_with_a_json_body_as_botocore_does() {
        let authorization = sign(&Request {
            method: "POST",
            path: "/clusters",
            query: "",
            headers: &[
                ("host", "example.amazonaws.com"),
                ("x-amz-date", "20150830T123600Z"),
                ("content-type", "application/json"),
            ],
            body: br#"{"name":"demo"}"#,
            region: "us-east-1",
            service: "eks",
            credentials: &example(),
        });
        assert_eq!(
            authorization,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/eks/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date, \
             Signature=ef5d8b7970bac994e6cae4950ab5f75269e2b7cfcb3010b1626c1fcd0a50cd97"
        );
    }

    #[test]
    fn presigns_a_get_as_botocore_does() {
        // botocore's `SigV4QueryAuth` (expires 60) of STS's GetCallerIdentity with the header
        // aws-iam-authenticator signs, at 2015-08-30T12:36:00Z.
        let url = presigned_get(
            "sts.us-east-1.amazonaws.com",
            "/",
            &[("Action", "GetCallerIdentity"), ("Version", "2011-06-15")],
            &[("x-k8s-aws-id", "shop")],
            "us-east-1",
            "sts",
            &example(),
            time::macros::datetime!(2015-08-30 12:36:00 UTC),
            60,
        );
        assert_eq!(
            url,
            "https://sts.us-east-1.amazonaws.com/?Action=GetCallerIdentity&Version=2011-06-15\
             &X-Amz-Algorithm=AWS4-HMAC-SHA256\
             &X-Amz-Credential=AKIDEXAMPLE%2F20150830%2Fus-east-1%2Fsts%2Faws4_request\
             &X-Amz-Date=20150830T123600Z&X-Amz-Expires=60\
             &X-Amz-SignedHeaders=host%3Bx-k8s-aws-id\
             &X-Amz-Signature=5e7c83cd2380c76be0fafb91d7b5f90b52105f5292882a5b57ea8251a77605b0"
        );
    }

    #[test]
    fn query_strings_are_encoded_and_sorted_for_signing() {
        assert_eq!(
            canonical_query(&[("b", "x y"), ("a", "1/2~"), ("Action", "GetCallerIdentity")]),
            "Action=GetCallerIdentity&a=1%2F2~&b=x%20y"
        );
    }

    #[test]
    fn amz_dates_are_basic_iso_8601_in_utc() {
        assert_eq!(
            amz_date(time::macros::datetime!(2026-01-02 03:04:05 UTC)),
            "20260102T030405Z"
        );
    }

    #[test]
    fn endpoints_must_be_https_and_name_a_host() {
        let credentials = Credentials {
            access_key_id: "AKID".into(),
            secret_access_key: "s".into(),
        };
        let client = |e: &str| Client::new(e, "r", "ec2", "2016-11-15", credentials.clone(), None);
        assert!(matches!(
            client("http://ec2.example"),
            Err(AwsError::Endpoint(..))
        ));
        assert!(matches!(client("https://"), Err(AwsError::Endpoint(..))));
        let ok = client("https://127.0.0.1:4566/ec2").unwrap();
        assert_eq!(
            (ok.host.as_str(), ok.port, ok.path.as_str()),
            ("127.0.0.1", 4566, "/ec2")
        );
        let default = client("https://ec2.eu-west-1.amazonaws.com").unwrap();
        assert_eq!((default.port, default.path.as_str()), (443, "/"));
    }
}
