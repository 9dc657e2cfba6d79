//! Tokens as the hub reads them from a request: the bearer header an agent's upgrade or a
//! user's request carries, split into kind, name and secret.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = http::HeaderValue::from_bytes(data) else {
        return;
    };
    let mut headers = http::HeaderMap::new();
    headers.insert(http::header::AUTHORIZATION, value);
    if let Some(token) = tunnel::bearer_token(&headers)
        && let Some((_, name, secret)) = hub::auth::secret::parse_token(token)
    {
        assert!(!name.is_empty() && !secret.is_empty());
        assert!(token.ends_with(secret) && token.contains(name));
    }
});
