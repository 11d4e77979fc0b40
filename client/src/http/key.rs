//! Reading the `Idempotency-Key` header: the structured-field string or a bare token.

use super::*;

/// Why a key header is not usable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyHeaderError {
    /// More than one header line.
    Repeated,
    /// Not visible ASCII.
    NotAscii,
    /// A quoted string with no closing quote, or with an escape.
    BadQuoting,
    /// The key breaks the key rule.
    Rule(KeyError),
}

impl fmt::Display for KeyHeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const RULE: &str = "a key is 16 to 255 characters of A-Z a-z 0-9 _ . : - (a UUID works)";
        match self {
            KeyHeaderError::Repeated => write!(f, "the header was sent more than once; send exactly one key"),
            KeyHeaderError::NotAscii => write!(f, "the header is not visible ASCII; {RULE}"),
            KeyHeaderError::BadQuoting => {
                write!(f, "the header starts a quoted string but is not one; send \"<key>\" or the bare key; {RULE}")
            }
            KeyHeaderError::Rule(KeyError::Length { len }) => write!(f, "the key is {len} characters long; {RULE}"),
            KeyHeaderError::Rule(KeyError::BadCharacter { offset, found }) => {
                write!(f, "the key has {found:?} at position {offset}; {RULE}")
            }
            KeyHeaderError::Rule(other) => write!(f, "{other}"),
        }
    }
}

/// Reads the key from the header's values: the IETF draft's structured-field string
/// (`"8e03978e-..."`) or Stripe's bare token, checked against the key rule. `Ok(None)` when
/// there is no header.
pub fn parse_key<'a>(mut values: impl Iterator<Item = &'a HeaderValue>) -> Result<Option<String>, KeyHeaderError> {
    let Some(value) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(KeyHeaderError::Repeated);
    }
    let text = value.to_str().map_err(|_| KeyHeaderError::NotAscii)?.trim_matches([' ', '\t']);
    let key = match text.strip_prefix('"') {
        Some(rest) => {
            let inner = rest.strip_suffix('"').ok_or(KeyHeaderError::BadQuoting)?;
            // The key rule has neither quotes nor backslashes, so an escape is never needed.
            if inner.contains(['"', '\\']) {
                return Err(KeyHeaderError::BadQuoting);
            }
            inner
        }
        None => text,
    };
    keys::validate(key).map_err(KeyHeaderError::Rule)?;
    Ok(Some(key.to_string()))
}
