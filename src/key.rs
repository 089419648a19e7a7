//! Job keys: the recipe's canonical form, its hash, and the key of a
//! (content, recipe) pair. Pure: no I/O.
//!
//! A key must equal the reference TypeScript implementation's byte for byte,
//! so the canonical form follows RFC 8785 (JCS): object keys sorted by UTF-16
//! code units, numbers in ECMAScript form, minimal string escapes.

use serde_json::{Map, Number, Value};
use sha2::{Digest, Sha256};

/// A processing recipe: which step, which version of its code, which params.
///
/// Bump `version` whenever the step's code changes what it produces: every
/// key changes with it, so new outputs land beside the old ones.
#[derive(Debug, Clone, PartialEq)]
pub struct Recipe {
    pub step: String,
    pub version: u64,
    pub params: Map<String, Value>,
}

/// What is wrong with a recipe, named so a producer can fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecipeError {
    #[error("recipe is not valid JSON: {0}")]
    InvalidJson(String),
    #[error("recipe must be a JSON object, got {0}")]
    NotAnObject(&'static str),
    #[error("recipe has no \"step\"")]
    MissingStep,
    #[error("recipe \"step\" must be a non-empty string")]
    BadStep,
    #[error("recipe has no \"version\"")]
    MissingVersion,
    #[error("recipe \"version\" must be a positive integer, got {0}")]
    BadVersion(String),
    #[error("recipe has no \"params\"")]
    MissingParams,
    #[error("recipe \"params\" must be a JSON object, got {0}")]
    BadParams(&'static str),
    #[error("recipe has an unknown field \"{0}\" (expected step, version, params)")]
    UnknownField(String),
}

/// The JSON type name of a value, for error messages.
pub(crate) fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl Recipe {
    /// Parses a recipe from the JSON text a producer sends.
    pub fn from_json(text: &str) -> Result<Self, RecipeError> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| RecipeError::InvalidJson(e.to_string()))?;
        Self::from_value(&value)
    }

    /// Validates a parsed recipe object. Fields other than step, version and
    /// params are refused: silently ignoring one would hide it from the key.
    pub fn from_value(value: &Value) -> Result<Self, RecipeError> {
        let object = value
            .as_object()
            .ok_or_else(|| RecipeError::NotAnObject(json_type(value)))?;
        if let Some(unknown) = object
            .keys()
            .find(|k| !matches!(k.as_str(), "step" | "version" | "params"))
        {
            return Err(RecipeError::UnknownField(unknown.clone()));
        }
        let step = match object.get("step") {
            None => return Err(RecipeError::MissingStep),
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(_) => return Err(RecipeError::BadStep),
        };
        let version = match object.get("version") {
            None => return Err(RecipeError::MissingVersion),
            Some(v) => positive_integer(v).ok_or_else(|| RecipeError::BadVersion(v.to_string()))?,
        };
        let params = match object.get("params") {
            None => return Err(RecipeError::MissingParams),
            Some(Value::Object(p)) => p.clone(),
            Some(other) => return Err(RecipeError::BadParams(json_type(other))),
        };
        Ok(Recipe {
            step,
            version,
            params,
        })
    }

    /// The recipe as the JSON object that is hashed.
    pub fn to_value(&self) -> Value {
        serde_json::json!({
            "step": self.step,
            "version": self.version,
            "params": self.params,
        })
    }

    /// RFC 8785 canonical JSON of `{step, version, params}`.
    pub fn canonical_json(&self) -> String {
        canonical_json(&self.to_value())
    }

    /// SHA-256 hex of the canonical JSON.
    pub fn hash(&self) -> String {
        sha256_hex(self.canonical_json().as_bytes())
    }
}

/// A version is a positive integer; `2.0` is the integer 2 in JSON's number
/// model (and in the reference implementation), so it is accepted.
fn positive_integer(value: &Value) -> Option<u64> {
    let number = value.as_number()?;
    if let Some(n) = number.as_u64() {
        return (n > 0).then_some(n);
    }
    let f = number.as_f64()?;
    let exact = f.fract() == 0.0 && (1.0..=MAX_SAFE_INTEGER).contains(&f);
    exact.then_some(f as u64)
}

const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_991.0;

/// RFC 8785 canonical JSON of any value.
///
/// `serde_jcs` sorts keys by UTF-16 code units and prints floats in
/// ECMAScript form, but prints integers as Rust does. ECMAScript has only
/// doubles: `12345678901234567891` is `12345678901234567000` there. So every
/// number goes through `f64` first, exactly as `JSON.parse` would round it.
pub fn canonical_json(value: &Value) -> String {
    let as_doubles = numbers_as_doubles(value);
    // Serialising a `Value` whose numbers are all finite cannot fail.
    serde_jcs::to_string(&as_doubles).expect("finite JSON value serialises")
}

fn numbers_as_doubles(value: &Value) -> Value {
    match value {
        Value::Number(n) => {
            let f = n.as_f64().unwrap_or(0.0);
            match Number::from_f64(f) {
                Some(n) => Value::Number(n),
                None => Value::Number(0.into()),
            }
        }
        Value::Array(items) => Value::Array(items.iter().map(numbers_as_doubles).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), numbers_as_doubles(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Lowercase hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The job key of (input, recipe): SHA-256 hex of `<input hash>\n<recipe hash>`.
pub fn job_key(input_hash: &str, recipe_hash: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(input_hash.as_bytes());
    hasher.update(b"\n");
    hasher.update(recipe_hash.as_bytes());
    hex::encode(hasher.finalize())
}

/// Checks an input hash given by a user. mediaonce's own are 64 lowercase
/// hex digits, but the reference implementation keys any string (its vectors
/// include `abc`), so only what would make the key ambiguous is refused: an
/// empty hash, or one containing the `\n` separator.
pub fn check_input_hash(text: &str) -> Result<(), String> {
    if text.is_empty() {
        return Err("input hash is empty".into());
    }
    if text.contains('\n') {
        return Err("input hash contains a newline, the separator of the key's two parts".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn recipe(v: Value) -> Result<Recipe, RecipeError> {
        Recipe::from_value(&v)
    }

    #[test]
    fn numbers_take_ecmascript_form() {
        assert_eq!(
            canonical_json(&json!([1.0, 1e21, 1e-7, 0.1])),
            "[1,1e+21,1e-7,0.1]"
        );
        let big: Value = serde_json::from_str("12345678901234567891").unwrap();
        assert_eq!(canonical_json(&big), "12345678901234567000");
        let minus_zero: Value = serde_json::from_str("-0.0").unwrap();
        assert_eq!(canonical_json(&minus_zero), "0");
    }

    #[test]
    fn keys_sort_by_utf16_code_units_not_code_points() {
        // U+FF61 is one UTF-16 unit 0xFF61; U+1F600 is the pair 0xD83D 0xDE00.
        // By code point the emoji sorts last, by UTF-16 unit it sorts first.
        let value = json!({"\u{FF61}": 1, "\u{1F600}": 2, "a": 3});
        assert_eq!(
            canonical_json(&value),
            "{\"a\":3,\"\u{1F600}\":2,\"\u{FF61}\":1}"
        );
    }

    #[test]
    fn strings_use_minimal_escapes() {
        assert_eq!(
            canonical_json(&json!("\u{0}\t\"\\/é</script>")),
            "\"\\u0000\\t\\\"\\\\/é</script>\""
        );
    }

    #[test]
    fn recipe_validation_names_the_problem() {
        assert_eq!(
            Recipe::from_json("[1]"),
            Err(RecipeError::NotAnObject("an array"))
        );
        assert!(matches!(
            Recipe::from_json("{"),
            Err(RecipeError::InvalidJson(_))
        ));
        assert_eq!(
            recipe(json!({"version": 1, "params": {}})),
            Err(RecipeError::MissingStep)
        );
        assert_eq!(
            recipe(json!({"step": "", "version": 1, "params": {}})),
            Err(RecipeError::BadStep)
        );
        assert_eq!(
            recipe(json!({"step": "probe", "version": 0, "params": {}})),
            Err(RecipeError::BadVersion("0".into()))
        );
        assert_eq!(
            recipe(json!({"step": "probe", "version": 1.5, "params": {}})),
            Err(RecipeError::BadVersion("1.5".into()))
        );
        assert_eq!(
            recipe(json!({"step": "probe", "version": "1", "params": {}})),
            Err(RecipeError::BadVersion("\"1\"".into()))
        );
        assert_eq!(
            recipe(json!({"step": "probe", "version": 1, "params": []})),
            Err(RecipeError::BadParams("an array"))
        );
        assert_eq!(
            recipe(json!({"step": "probe", "version": 1})),
            Err(RecipeError::MissingParams)
        );
        assert_eq!(
            recipe(json!({"step": "probe", "version": 1, "params": {}, "match": {}})),
            Err(RecipeError::UnknownField("match".into()))
        );
        assert_eq!(
            recipe(json!({"step": "probe", "version": 2.0, "params": {}})).map(|r| r.version),
            Ok(2)
        );
    }

    #[test]
    fn key_changes_with_version() {
        let v1 = recipe(json!({"step": "probe", "version": 1, "params": {}})).unwrap();
        let v2 = recipe(json!({"step": "probe", "version": 2, "params": {}})).unwrap();
        let input = "a".repeat(64);
        assert_ne!(job_key(&input, &v1.hash()), job_key(&input, &v2.hash()));
        let key = job_key(&input, &v1.hash());
        assert!(key.len() == 64 && key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
        assert!(check_input_hash("").is_err());
        assert!(check_input_hash("a\nb").is_err());
        assert!(check_input_hash("abc").is_ok());
    }
}
