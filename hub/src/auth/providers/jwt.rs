//! Checking an OpenID Connect ID token: a JWS (RFC 7515) signed with one of the provider's keys
//! (its JWK set, RFC 7517), verified with ring; and its claims (issuer, audience, expiry, issue
//! time, nonce) with a clock skew allowed. Only asymmetric algorithms: `none` and HMAC are
//! refused (a client secret must not sign what proves who a user is).

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD as B64};
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde::Deserialize;
use serde_json::Value;

/// One key of a provider's JWK set (the fields used here).
#[derive(Debug, Clone, Deserialize)]
pub struct Jwk {
    pub kty: String,
    #[serde(default)]
    pub kid: Option<String>,
    #[serde(default, rename = "use")]
    pub usage: Option<String>,
    #[serde(default)]
    pub alg: Option<String>,
    #[serde(default)]
    pub n: Option<String>,
    #[serde(default)]
    pub e: Option<String>,
    #[serde(default)]
    pub crv: Option<String>,
    #[serde(default)]
    pub x: Option<String>,
    #[serde(default)]
    pub y: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct JwkSet {
    pub keys: Vec<Jwk>,
}

#[derive(Debug, Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
}

/// What an ID token must say.
#[derive(Debug, Clone)]
pub struct Expected<'a> {
    pub issuer: &'a str,
    pub audience: &'a str,
    pub nonce: Option<&'a str>,
    pub skew_seconds: i64,
    pub now: i64,
}

/// The header's `kid`, if any: a key set without it may be stale (keys rotate).
pub fn key_id(token: &str) -> Option<String> {
    let header = token.split('.').next()?;
    let header: Header = serde_json::from_slice(&B64.decode(header).ok()?).ok()?;
    header.kid
}

/// Verifies `token`'s signature with a key of `keys` and its claims against `expected`;
/// returns the claims. The message says which check failed.
pub fn verify(token: &str, keys: &JwkSet, expected: &Expected<'_>) -> Result<Value, String> {
    let mut parts = token.split('.');
    let (Some(header_b64), Some(payload_b64), Some(signature_b64), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("the ID token is not a signed JWT (three dot-separated parts)".into());
    };
    let header: Header = B64
        .decode(header_b64)
        .ok()
        .and_then(|h| serde_json::from_slice(&h).ok())
        .ok_or("the ID token's header is not base64url JSON")?;
    let signature = B64
        .decode(signature_b64)
        .map_err(|_| "the ID token's signature is not base64url")?;
    let signed = format!("{header_b64}.{payload_b64}");
    let candidates: Vec<&Jwk> = keys
        .keys
        .iter()
        .filter(|k| k.usage.as_deref().is_none_or(|u| u == "sig"))
        .filter(|k| k.alg.as_deref().is_none_or(|a| a == header.alg))
        .filter(|k| header.kid.is_none() || k.kid == header.kid)
        .collect();
    if candidates.is_empty() {
        let kid = header
            .kid
            .as_deref()
            .map_or_else(|| "no key id".to_owned(), |k| format!("key id {k}"));
        return Err(format!(
            "the ID token was signed with a key the provider does not publish ({kid}, algorithm {})",
            header.alg
        ));
    }
    let verified = candidates
        .iter()
        .any(|key| check_signature(&header.alg, key, signed.as_bytes(), &signature).is_ok());
    if !verified {
        // Say why for the first candidate (an unsupported algorithm, or a bad signature).
        return Err(
            check_signature(&header.alg, candidates[0], signed.as_bytes(), &signature)
                .err()
                .unwrap_or_else(|| "the ID token's signature does not verify".into()),
        );
    }
    let claims: Value = B64
        .decode(payload_b64)
        .ok()
        .and_then(|p| serde_json::from_slice(&p).ok())
        .ok_or("the ID token's claims are not base64url JSON")?;
    check_claims(&claims, expected)?;
    Ok(claims)
}

fn check_signature(alg: &str, key: &Jwk, message: &[u8], signature: &[u8]) -> Result<(), String> {
    let bad = || "the ID token's signature does not verify".to_owned();
    let decode = |field: &Option<String>, name: &str| {
        field
            .as_deref()
            .and_then(|v| B64.decode(v).ok())
            .ok_or_else(|| format!("the provider's {} key has no usable {name}", key.kty))
    };
    let rsa = |params: &'static signature::RsaParameters| -> Result<(), String> {
        if key.kty != "RSA" {
            return Err(format!("{alg} needs an RSA key, the key is {}", key.kty));
        }
        let components = RsaPublicKeyComponents {
            n: decode(&key.n, "n")?,
            e: decode(&key.e, "e")?,
        };
        components
            .verify(params, message, signature)
            .map_err(|_| bad())
    };
    let ec = |alg_ring: &'static signature::EcdsaVerificationAlgorithm,
              curve: &str|
     -> Result<(), String> {
        if key.kty != "EC" || key.crv.as_deref() != Some(curve) {
            return Err(format!("{alg} needs an EC {curve} key"));
        }
        let mut point = vec![4u8];
        point.extend(decode(&key.x, "x")?);
        point.extend(decode(&key.y, "y")?);
        UnparsedPublicKey::new(alg_ring, point)
            .verify(message, signature)
            .map_err(|_| bad())
    };
    match alg {
        "RS256" => rsa(&signature::RSA_PKCS1_2048_8192_SHA256),
        "RS384" => rsa(&signature::RSA_PKCS1_2048_8192_SHA384),
        "RS512" => rsa(&signature::RSA_PKCS1_2048_8192_SHA512),
        "PS256" => rsa(&signature::RSA_PSS_2048_8192_SHA256),
        "PS384" => rsa(&signature::RSA_PSS_2048_8192_SHA384),
        "PS512" => rsa(&signature::RSA_PSS_2048_8192_SHA512),
        "ES256" => ec(&signature::ECDSA_P256_SHA256_FIXED, "P-256"),
        "ES384" => ec(&signature::ECDSA_P384_SHA384_FIXED, "P-384"),
        other => Err(format!(
            "the ID token is signed with {other}; only RS256/384/512, PS256/384/512, ES256 and ES384 are accepted"
        )),
    }
}

fn check_claims(claims: &Value, expected: &Expected<'_>) -> Result<(), String> {
    let text = |name: &str| claims.get(name).and_then(Value::as_str);
    let number = |name: &str| claims.get(name).and_then(Value::as_i64);
    if text("iss") != Some(expected.issuer) {
        return Err(format!(
            "the ID token's issuer {:?} is not {:?}",
            text("iss").unwrap_or_default(),
            expected.issuer
        ));
    }
    let audiences: Vec<&str> = match claims.get("aud") {
        Some(Value::String(one)) => vec![one.as_str()],
        Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if !audiences.contains(&expected.audience) {
        return Err(format!(
            "the ID token is for {}, not this hub's client {:?}",
            if audiences.is_empty() {
                "no audience".to_owned()
            } else {
                format!("the audience {}", audiences.join(", "))
            },
            expected.audience
        ));
    }
    // Several audiences: the token must have been issued to this client (OIDC Core 3.1.3.7).
    if audiences.len() > 1 && text("azp") != Some(expected.audience) {
        return Err("the ID token has several audiences and another authorized party".into());
    }
    let exp = number("exp").ok_or("the ID token has no expiry (exp)")?;
    if exp + expected.skew_seconds < expected.now {
        return Err(format!("the ID token expired {} s ago", expected.now - exp));
    }
    if let Some(iat) = number("iat")
        && iat - expected.skew_seconds > expected.now
    {
        return Err("the ID token was issued in the future (check the clocks)".into());
    }
    if let Some(nonce) = expected.nonce
        && text("nonce") != Some(nonce)
    {
        return Err("the ID token's nonce is not the one this login sent".into());
    }
    if text("sub").is_none_or(str::is_empty) {
        return Err("the ID token names no subject (sub)".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::{
        rand::SystemRandom,
        signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _},
    };
    use serde_json::json;

    /// An ES256 key (ring can make those), its JWK, and tokens it signs.
    struct Signer {
        pair: EcdsaKeyPair,
        jwk: Jwk,
    }

    impl Signer {
        fn new(kid: &str) -> Self {
            let rng = SystemRandom::new();
            let pkcs8 =
                EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
            let pair =
                EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
                    .unwrap();
            let point = pair.public_key().as_ref();
            let jwk = Jwk {
                kty: "EC".into(),
                kid: Some(kid.into()),
                usage: Some("sig".into()),
                alg: Some("ES256".into()),
                n: None,
                e: None,
                crv: Some("P-256".into()),
                x: Some(B64.encode(&point[1..33])),
                y: Some(B64.encode(&point[33..65])),
            };
            Signer { pair, jwk }
        }

        fn sign(&self, header: Value, claims: Value) -> String {
            let input = format!(
                "{}.{}",
                B64.encode(header.to_string()),
                B64.encode(claims.to_string())
            );
            let sig = self
                .pair
                .sign(&SystemRandom::new(), input.as_bytes())
                .unwrap();
            format!("{input}.{}", B64.encode(sig.as_ref()))
        }
    }

    const NOW: i64 = 1_800_000_000;

    fn expected() -> Expected<'static> {
        Expected {
            issuer: "https://idp.example.com",
            audience: "drover",
            nonce: Some("n-1"),
            skew_seconds: 60,
            now: NOW,
        }
    }

    fn claims() -> Value {
        json!({"iss": "https://idp.example.com", "aud": "drover", "sub": "u-1",
               "exp": NOW + 300, "iat": NOW, "nonce": "n-1"})
    }

    #[test]
    fn a_token_signed_by_the_providers_key_with_the_right_claims_passes() {
        let signer = Signer::new("k1");
        let keys = JwkSet {
            keys: vec![signer.jwk.clone()],
        };
        let token = signer.sign(json!({"alg": "ES256", "kid": "k1"}), claims());
        assert_eq!(verify(&token, &keys, &expected()).unwrap()["sub"], "u-1");
        assert_eq!(key_id(&token).as_deref(), Some("k1"));
    }

    #[test]
    fn each_wrong_claim_or_signature_is_refused_naming_what_is_wrong() {
        let signer = Signer::new("k1");
        let keys = JwkSet {
            keys: vec![signer.jwk.clone()],
        };
        let header = json!({"alg": "ES256", "kid": "k1"});
        let with = |field: &str, value: Value| {
            let mut c = claims();
            c[field] = value;
            signer.sign(header.clone(), c)
        };
        for (token, says) in [
            (with("iss", "https://evil.example.com".into()), "issuer"),
            (with("aud", "someone-else".into()), "not this hub's client"),
            (with("exp", (NOW - 61).into()), "expired"),
            (with("iat", (NOW + 120).into()), "future"),
            (with("nonce", "n-2".into()), "nonce"),
            (with("sub", "".into()), "subject"),
            (with("aud", json!(["drover", "other"])), "authorized party"),
        ] {
            let refused = verify(&token, &keys, &expected()).unwrap_err();
            assert!(refused.contains(says), "{says}: {refused}");
        }
        // Within the skew: still valid.
        assert!(verify(&with("exp", (NOW - 30).into()), &keys, &expected()).is_ok());
        // Another key's signature, a changed payload, `none` and HMAC are refused.
        let other = Signer::new("k1");
        let forged = other.sign(header.clone(), claims());
        assert!(
            verify(&forged, &keys, &expected())
                .unwrap_err()
                .contains("signature")
        );
        let token = signer.sign(header.clone(), claims());
        let mut parts: Vec<&str> = token.split('.').collect();
        let changed = B64.encode(with_sub("u-2").to_string());
        parts[1] = &changed;
        assert!(
            verify(&parts.join("."), &keys, &expected())
                .unwrap_err()
                .contains("signature")
        );
        let none = format!(
            "{}.{}.",
            B64.encode(json!({"alg": "none"}).to_string()),
            B64.encode(claims().to_string())
        );
        assert!(verify(&none, &keys, &expected()).is_err());
        let mut hmac_key = signer.jwk.clone();
        hmac_key.alg = None;
        let hs = signer.sign(json!({"alg": "HS256", "kid": "k1"}), claims());
        let refused = verify(
            &hs,
            &JwkSet {
                keys: vec![hmac_key],
            },
            &expected(),
        )
        .unwrap_err();
        assert!(refused.contains("only RS256"), "{refused}");
    }

    fn with_sub(sub: &str) -> Value {
        let mut c = claims();
        c["sub"] = sub.into();
        c
    }
}
