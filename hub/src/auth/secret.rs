//! Secrets at rest: passwords through a memory-hard KDF (argon2id), bearer tokens as random
//! values of which only a sha256 is kept. Every comparison takes the same time whatever the
//! bytes, so timing tells an attacker nothing.

use base64::Engine as _;
use ring::rand::{SecureRandom, SystemRandom};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// OWASP's argon2id baseline: 19 MiB, two passes, one lane.
const M_COST_KIB: u32 = 19 * 1024;
const T_COST: u32 = 2;
const P_COST: u32 = 1;

fn random<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    // The system RNG does not fail on Linux; if it ever did, refuse to go on with a zero secret.
    if SystemRandom::new().fill(&mut bytes).is_err() {
        panic!(
            "the system random number generator failed; refusing to create a predictable secret"
        );
    }
    bytes
}

/// Equal-time comparison.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn argon2(password: &str, salt: &[u8], m: u32, t: u32, p: u32) -> Result<[u8; 32], String> {
    let params = argon2::Params::new(m, t, p, Some(32)).map_err(|e| e.to_string())?;
    let kdf = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    let mut out = [0u8; 32];
    kdf.hash_password_into(password.as_bytes(), salt, &mut out)
        .map_err(|e| e.to_string())?;
    Ok(out)
}

/// A PHC string: `$argon2id$v=19$m=19456,t=2,p=1$<salt>$<hash>` (base64 without padding).
pub fn hash_password(password: &str) -> String {
    let salt = random::<16>();
    match argon2(password, &salt, M_COST_KIB, T_COST, P_COST) {
        Ok(hash) => format!(
            "$argon2id$v=19$m={M_COST_KIB},t={T_COST},p={P_COST}${}${}",
            B64.encode(salt),
            B64.encode(hash)
        ),
        // Only reachable with invalid constant parameters.
        Err(e) => panic!("argon2 parameters are invalid: {e}"),
    }
}

/// Checks `password` against a PHC string made by [`hash_password`] (any cost parameters).
pub fn verify_password(password: &str, phc: &str) -> bool {
    let parts: Vec<&str> = phc.split('$').collect();
    let [_, "argon2id", "v=19", params, salt, hash] = parts[..] else {
        return false;
    };
    let mut m = 0;
    let mut t = 0;
    let mut p = 0;
    for kv in params.split(',') {
        match kv.split_once('=') {
            Some(("m", v)) => m = v.parse().unwrap_or(0),
            Some(("t", v)) => t = v.parse().unwrap_or(0),
            Some(("p", v)) => p = v.parse().unwrap_or(0),
            _ => return false,
        }
    }
    let (Ok(salt), Ok(expected)) = (B64.decode(salt), B64.decode(hash)) else {
        return false;
    };
    match argon2(password, &salt, m, t, p) {
        Ok(got) => same(&got, &expected),
        Err(_) => false,
    }
}

/// A random password for the bootstrap admin: 24 characters of base64url (144 bits).
pub fn random_password() -> String {
    random_text::<18>()
}

/// `N` random bytes as base64url text (a login's `state`, `nonce` and PKCE verifier).
pub fn random_text<const N: usize>() -> String {
    B64.encode(random::<N>())
}

/// The letters of a device login's user code: no vowels (no words) and none that look alike
/// (RFC 8628 6.1's example set).
const USER_CODE_LETTERS: &[u8; 20] = b"BCDFGHJKLMNPQRSTVWXZ";

/// A user code for a command line's sign-in, as people read and type it: `BCDF-GHJK` (eight
/// letters of twenty, about 34 bits; guesses are limited per user).
pub fn user_code() -> String {
    let letters: String = random::<8>()
        .iter()
        // 256 = 12 × 20 + 16: the first 240 values map evenly; the bias of the rest is
        // below what matters for a code that lives minutes and allows five wrong guesses.
        .map(|b| char::from(USER_CODE_LETTERS[usize::from(*b) % USER_CODE_LETTERS.len()]))
        .collect();
    format!("{}-{}", &letters[..4], &letters[4..])
}

/// A user code as typed (any case, with or without its dash or spaces) in its stored form,
/// lowercase without the dash (an object name); `None` if it cannot be one.
pub fn normal_user_code(typed: &str) -> Option<String> {
    let letters: String = typed
        .chars()
        .filter(|c| !matches!(c, '-' | ' '))
        .map(|c| c.to_ascii_uppercase())
        .collect();
    (letters.len() == 8 && letters.bytes().all(|b| USER_CODE_LETTERS.contains(&b)))
        .then(|| letters.to_ascii_lowercase())
}

/// sha256 of a token secret, hex (one definition with the authorized endpoint's authenticator).
pub use proto::token_hash;

/// Whether `secret` opens the stored token `object`: its hash matches, it has not expired and
/// it is not being deleted.
pub fn opens(object: &crate::store::Object, secret: &str) -> bool {
    let hash = object
        .spec
        .get("secretHash")
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default();
    same(token_hash(secret).as_bytes(), hash.as_bytes())
        && !crate::model::expired(&object.spec)
        && object.metadata.deletion_timestamp.is_none()
}

/// What a bearer token refers to, by its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// A Token object: an API token, a login session, or an agent's credential.
    Token,
    /// A RegistrationToken object.
    Registration,
}

impl TokenKind {
    fn prefix(self) -> &'static str {
        match self {
            TokenKind::Token => "drt_",
            TokenKind::Registration => "drr_",
        }
    }
}

/// A new token: the object name to store it under, and the full value to show once.
pub struct NewToken {
    pub name: String,
    pub value: String,
    pub hash: String,
}

impl std::fmt::Debug for NewToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The value is a credential: never in a log.
        f.debug_struct("NewToken")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Creates a token value `<prefix><name>.<secret>`. The name is a valid object name; the
/// secret has 256 bits.
pub fn new_token(kind: TokenKind) -> NewToken {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let id: String = random::<12>()
        .iter()
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect();
    let name = format!("t{id}");
    let secret = B64.encode(random::<32>());
    NewToken {
        value: format!("{}{name}.{secret}", kind.prefix()),
        hash: token_hash(&secret),
        name,
    }
}

/// Splits a token value into its kind, object name and secret.
pub fn parse_token(value: &str) -> Option<(TokenKind, &str, &str)> {
    for kind in [TokenKind::Token, TokenKind::Registration] {
        if let Some(rest) = value.strip_prefix(kind.prefix()) {
            let (name, secret) = rest.split_once('.')?;
            if name.is_empty() || secret.is_empty() {
                return None;
            }
            return Some((kind, name, secret));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_verifies_only_against_its_own_hash() {
        let phc = hash_password("correct horse battery staple");
        assert!(phc.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"));
        assert!(verify_password("correct horse battery staple", &phc));
        assert!(!verify_password("correct horse battery stapler", &phc));
        assert!(!verify_password(
            "correct horse battery staple",
            "$argon2id$v=19$garbage"
        ));
        assert_ne!(phc, hash_password("correct horse battery staple"), "salted");
    }

    #[test]
    fn tokens_parse_back_and_hash_their_secret_only() {
        let token = new_token(TokenKind::Registration);
        let (kind, name, secret) = parse_token(&token.value).unwrap();
        assert_eq!((kind, name), (TokenKind::Registration, token.name.as_str()));
        assert_eq!(token_hash(secret), token.hash);
        // Hashes already stored must keep matching: lowercase hex of sha256.
        assert_eq!(
            token_hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(crate::model::validate_name(crate::model::Kind::Token, name).is_ok());
        assert!(parse_token("drt_.x").is_none());
        assert!(parse_token("Bearer nope").is_none());
    }

    #[test]
    fn equal_time_comparison_is_still_a_comparison() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"ab"));
    }
}
