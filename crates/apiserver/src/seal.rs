//! Sealing secrets kept in a shared store: the server replicas of one installation keep their
//! CA key and admin token in the store, encrypted with a key derived from the installation's
//! `--cluster-secret`, so that whoever reads the store (an etcd backup, a snapshot) without the
//! secret learns nothing of them.
//!
//! ChaCha20-Poly1305 (ring) under a key derived with HKDF-SHA256 from the secret; a random
//! 96-bit nonce per sealing; sealed text is `v1:` and the base64 of nonce ‖ ciphertext ‖ tag.

use base64::Engine;
use ring::aead::{self, Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
use ring::hkdf;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SealError {
    #[error("the cluster secret is empty")]
    EmptySecret,
    #[error("sealed data is malformed: {0}")]
    Malformed(&'static str),
    /// The secret differs from the one that sealed it, or the data was altered.
    #[error(
        "sealed data cannot be opened with this cluster secret (a different secret, or altered data)"
    )]
    WrongKey,
    #[error("no randomness: {0}")]
    Random(String),
}

const PREFIX: &str = "v1:";
const SALT: &[u8] = b"orrery cluster secret";

/// A key derived from the cluster secret.
pub struct Sealer {
    key: LessSafeKey,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(..)")
    }
}

struct KeyLen;

impl hkdf::KeyType for KeyLen {
    fn len(&self) -> usize {
        CHACHA20_POLY1305.key_len()
    }
}

impl Sealer {
    /// Derives the sealing key; `purpose` separates keys for different records.
    pub fn new(secret: &[u8], purpose: &str) -> Result<Sealer, SealError> {
        if secret.is_empty() {
            return Err(SealError::EmptySecret);
        }
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, SALT).extract(secret);
        let info = [purpose.as_bytes()];
        let mut bytes = [0u8; 32];
        prk.expand(&info, KeyLen)
            .and_then(|okm| okm.fill(&mut bytes))
            .map_err(|_| SealError::Malformed("key derivation"))?;
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, &bytes)
            .map_err(|_| SealError::Malformed("key length"))?;
        Ok(Sealer {
            key: LessSafeKey::new(unbound),
        })
    }

    pub fn seal(&self, plain: &[u8]) -> Result<String, SealError> {
        let mut nonce = [0u8; aead::NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|e| SealError::Random(e.to_string()))?;
        let mut data = plain.to_vec();
        self.key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut data)
            .map_err(|_| SealError::Malformed("sealing"))?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&data);
        Ok(format!(
            "{PREFIX}{}",
            base64::engine::general_purpose::STANDARD.encode(out)
        ))
    }

    pub fn open(&self, sealed: &str) -> Result<Vec<u8>, SealError> {
        let body = sealed
            .strip_prefix(PREFIX)
            .ok_or(SealError::Malformed("unknown version"))?;
        let raw = base64::engine::general_purpose::STANDARD
            .decode(body)
            .map_err(|_| SealError::Malformed("not base64"))?;
        if raw.len() < aead::NONCE_LEN + CHACHA20_POLY1305.tag_len() {
            return Err(SealError::Malformed("too short"));
        }
        let (nonce, rest) = raw.split_at(aead::NONCE_LEN);
        let nonce =
            Nonce::try_assume_unique_for_key(nonce).map_err(|_| SealError::Malformed("nonce"))?;
        let mut data = rest.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::empty(), &mut data)
            .map_err(|_| SealError::WrongKey)?;
        Ok(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn sealed_text_opens_with_the_same_secret_only() {
        let a = Sealer::new(b"s3cret", "identity").unwrap();
        let sealed = a.seal(b"the CA key").unwrap();
        assert!(!sealed.contains("the CA key"));
        assert_eq!(a.open(&sealed).unwrap(), b"the CA key");
        // Two sealings of one text differ (fresh nonces).
        assert_ne!(a.seal(b"the CA key").unwrap(), sealed);
        let other = Sealer::new(b"another", "identity").unwrap();
        assert_eq!(other.open(&sealed), Err(SealError::WrongKey));
        let purpose = Sealer::new(b"s3cret", "tokens").unwrap();
        assert_eq!(purpose.open(&sealed), Err(SealError::WrongKey));
    }

    #[test]
    fn altered_or_malformed_text_is_refused() {
        let a = Sealer::new(b"s3cret", "identity").unwrap();
        let sealed = a.seal(b"payload").unwrap();
        let mut raw = base64::engine::general_purpose::STANDARD
            .decode(&sealed[3..])
            .unwrap();
        let last = raw.len() - 1;
        raw[last] ^= 1;
        let altered = format!(
            "v1:{}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        );
        assert_eq!(a.open(&altered), Err(SealError::WrongKey));
        for bad in ["", "v2:AAAA", "v1:***", "v1:AAAA"] {
            assert!(matches!(a.open(bad), Err(SealError::Malformed(_))), "{bad}");
        }
        assert_eq!(Sealer::new(b"", "x").unwrap_err(), SealError::EmptySecret);
    }
}
