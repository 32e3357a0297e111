//! One reading of JSON documents, the same for every request body and
//! for every document drover derives from another (a patched pool spec).
//!
//! serde_json on its own is lenient in two ways an API should not be: an
//! object with the same key twice keeps the last one (so two parsers, say a
//! proxy's and ours, can disagree on what was asked), and a struct may be
//! sent as an array of its fields in order (`"strategy": [null, null]`).
//! Bodies are therefore read in two steps: [`parse_value`] builds a JSON
//! value and refuses duplicate keys at any depth, then [`from_value`] turns
//! it into the target type through [`Strict`], a deserializer that only
//! lets a struct be read from an object.

use std::cell::RefCell;
use std::fmt;

use serde::de::value::StringDeserializer;
use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde::forward_to_deserialize_any;
use serde_json::{Map, Number, Value};

use super::ValidationErrors;

/// Why a document could not be read, and where in it.
#[derive(Debug)]
pub enum JsonError {
    /// The text is not JSON at all.
    Syntax(serde_json::Error),
    /// JSON of the wrong shape. `path` is `.` for the document itself,
    /// else like `inner.list[1]`.
    Shape { path: String, error: ShapeError },
}

/// What is wrong with the shape of a document, as the deserializer of
/// [`from_value`] reports it (its own error type, so that no message is
/// read back to know which rule was broken).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error("unknown field `{field}`, expected {}", one_of(expected))]
    UnknownField { field: String, expected: &'static [&'static str] },
    #[error("missing field `{0}`")]
    MissingField(&'static str),
    #[error("duplicate key `{0}`")]
    DuplicateKey(String),
    /// A value that reads as its type but breaks that type's rule (a name
    /// that is not a DNS label): the rule's name and why.
    #[error("{message}")]
    Rule { rule: &'static str, message: String },
    /// A value of the wrong type, or out of its type's range.
    #[error("{0}")]
    Type(String),
}

fn one_of(expected: &[&str]) -> String {
    match expected {
        [] => "no fields".to_owned(),
        [one] => format!("`{one}`"),
        more => format!("one of {}", more.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>().join(", ")),
    }
}

impl de::Error for ShapeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Self::Type(msg.to_string())
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        Self::UnknownField { field: field.to_owned(), expected }
    }

    fn missing_field(field: &'static str) -> Self {
        Self::MissingField(field)
    }
}

impl ShapeError {
    /// The rule broken, as `FieldError::rule` names it.
    pub fn rule(&self) -> &'static str {
        match self {
            Self::UnknownField { .. } => "unknown_field",
            Self::MissingField(_) => "required",
            Self::DuplicateKey(_) => "duplicate_key",
            Self::Rule { rule, .. } => rule,
            Self::Type(_) => "type",
        }
    }

    /// The field it names, under the path of the object holding it (an
    /// unknown field's name already ends the path; a missing one's does not).
    fn field(&self, path: &str) -> String {
        let named = match self {
            Self::MissingField(name) => Some(*name),
            Self::DuplicateKey(key) => Some(key.as_str()),
            _ => None,
        };
        let whole = path == "." || path.is_empty();
        match named {
            Some(name) if whole => name.to_owned(),
            Some(name) => format!("{path}.{name}"),
            None if whole => "body".to_owned(),
            None => path.to_owned(),
        }
    }
}

impl From<serde_path_to_error::Error<ShapeError>> for JsonError {
    fn from(e: serde_path_to_error::Error<ShapeError>) -> Self {
        Self::Shape { path: e.path().to_string(), error: e.into_inner() }
    }
}

/// Parses `bytes` as one JSON document, refusing an object that names a key
/// twice. The error's path leads to the object holding the duplicate.
pub fn parse_value(bytes: &[u8]) -> Result<Value, JsonError> {
    let duplicate = RefCell::new(None);
    let mut track = serde_path_to_error::Track::new();
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let parsed = UniqueKeys(&duplicate).deserialize(serde_path_to_error::Deserializer::new(&mut de, &mut track));
    match (parsed, duplicate.into_inner()) {
        (_, Some(key)) => {
            Err(JsonError::Shape { path: track.path().to_string(), error: ShapeError::DuplicateKey(key) })
        }
        (Err(e), None) => Err(JsonError::Syntax(e)),
        (Ok(value), None) => de.end().map(|()| value).map_err(JsonError::Syntax),
    }
}

/// Reads `T` from a parsed value; structs only from objects.
pub fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, JsonError> {
    Ok(serde_path_to_error::deserialize(Strict(value))?)
}

/// Reads `T` from a parsed value, every shape error as the field at fault
/// and the rule it broke (`type`, `required`, `unknown_field`, ...).
pub fn document<T: DeserializeOwned>(value: Value) -> Result<T, ValidationErrors> {
    from_value(value).map_err(|e| e.into_validation())
}

/// A body that is a `name` beside another type's fields (the create bodies
/// of pools, engines and clusters): the name and the rest, each read with
/// its own errors, so that the caller can report every rule both break.
pub struct Named<T> {
    pub name: Result<super::names::DnsLabel, ValidationErrors>,
    pub rest: Result<T, ValidationErrors>,
}

/// Splits `body` into its `name` and the rest, read as `T`.
pub fn named<T: DeserializeOwned>(body: Value) -> Result<Named<T>, ValidationErrors> {
    #[derive(serde::Deserialize)]
    struct Name {
        name: super::names::DnsLabel,
    }
    let Value::Object(mut fields) = body else {
        return Err(ValidationErrors::single("body", "type", "must be a JSON object"));
    };
    let name = match fields.remove("name") {
        Some(name) => document::<Name>(Value::Object(Map::from_iter([("name".to_owned(), name)]))).map(|n| n.name),
        None => Err(ValidationErrors::single("name", "required", ShapeError::MissingField("name"))),
    };
    Ok(Named { name, rest: document(Value::Object(fields)) })
}

impl<T> Named<T> {
    /// The name and the rest, or every error of both.
    pub fn both(self) -> Result<(super::names::DnsLabel, T), ValidationErrors> {
        ValidationErrors::join(self.name, self.rest)
    }
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Syntax(e) => e.fmt(f),
            Self::Shape { path, error } => write!(f, "{error} at {path}"),
        }
    }
}

impl JsonError {
    /// The field at fault and the rule it broke (broken JSON: the body).
    pub fn into_validation(self) -> ValidationErrors {
        match self {
            Self::Syntax(e) => ValidationErrors::single("body", "syntax", e),
            Self::Shape { path, error } => ValidationErrors::single(error.field(&path), error.rule(), &error),
        }
    }
}

/// Reads any JSON value, noting the first key an object repeats (in its
/// cell) and stopping there.
struct UniqueKeys<'a>(&'a RefCell<Option<String>>);

impl<'de> DeserializeSeed<'de> for UniqueKeys<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for UniqueKeys<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // JSON has no NaN or infinity, so this never yields null in practice.
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(v) = seq.next_element_seed(UniqueKeys(self.0))? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut fields = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if fields.contains_key(&key) {
                *self.0.borrow_mut() = Some(key);
                return Err(de::Error::custom("duplicate key"));
            }
            let v = map.next_value_seed(UniqueKeys(self.0))?;
            fields.insert(key, v);
        }
        Ok(Value::Object(fields))
    }
}

/// Deserializes from an owned value like serde_json's own `Value` does,
/// except that a struct must come from an object, never from an array.
struct Strict(Value);

fn unexpected(v: &Value) -> de::Unexpected<'_> {
    match v {
        Value::Null => de::Unexpected::Unit,
        Value::Bool(b) => de::Unexpected::Bool(*b),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => de::Unexpected::Unsigned(u),
            (None, Some(i)) => de::Unexpected::Signed(i),
            _ => de::Unexpected::Float(n.as_f64().unwrap_or_default()),
        },
        Value::String(s) => de::Unexpected::Str(s),
        Value::Array(_) => de::Unexpected::Seq,
        Value::Object(_) => de::Unexpected::Map,
    }
}

impl<'de> de::Deserializer<'de> for Strict {
    type Error = ShapeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(b),
            Value::Number(n) => match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => visitor.visit_u64(u),
                (None, Some(i)) => visitor.visit_i64(i),
                _ => visitor.visit_f64(n.as_f64().unwrap_or_default()),
            },
            Value::String(s) => visitor.visit_string(s),
            Value::Array(items) => {
                let len = items.len();
                let mut seq = Items(items.into_iter());
                let out = visitor.visit_seq(&mut seq)?;
                if seq.0.len() == 0 { Ok(out) } else { Err(de::Error::invalid_length(len, &"fewer elements")) }
            }
            Value::Object(fields) => visitor.visit_map(Fields { iter: fields.into_iter(), value: None }),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            other => visitor.visit_some(Strict(other)),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Object(_) => self.deserialize_any(visitor),
            other => Err(de::Error::invalid_type(unexpected(&other), &"an object")),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::String(s) => {
                let de: StringDeserializer<ShapeError> = s.into_deserializer();
                visitor.visit_enum(de)
            }
            // Enums with data (none in the API's bodies today) are read as
            // serde_json reads them.
            other => de::Deserializer::deserialize_enum(other, name, variants, visitor)
                .map_err(|e| ShapeError::Type(e.to_string())),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        // A name that breaks the DNS-label rule is that rule's error, not a
        // type error.
        if name == super::names::DnsLabel::SERDE_NAME
            && let Value::String(s) = &self.0
            && let Err(e) = super::names::check_dns_label(s)
        {
            return Err(ShapeError::Rule { rule: "dns_label", message: e.to_string() });
        }
        visitor.visit_newtype_struct(self)
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map identifier ignored_any
    }
}

struct Items(std::vec::IntoIter<Value>);

impl<'de> SeqAccess<'de> for Items {
    type Error = ShapeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, Self::Error> {
        self.0.next().map(|v| seed.deserialize(Strict(v))).transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

struct Fields {
    iter: serde_json::map::IntoIter,
    value: Option<Value>,
}

impl<'de> MapAccess<'de> for Fields {
    type Error = ShapeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Self::Error> {
        let Some((key, value)) = self.iter.next() else { return Ok(None) };
        self.value = Some(value);
        let key: StringDeserializer<ShapeError> = key.into_deserializer();
        seed.deserialize(key).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Self::Error> {
        let value = self.value.take().ok_or_else(|| de::Error::custom("a value was read before its key"))?;
        seed.deserialize(Strict(value))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

/// The property names of `T`'s schema, sorted: for the tests that keep two
/// types field for field alike (what clients send and what they see, a
/// registration and its `drover apply` document).
#[cfg(test)]
pub fn schema_properties<T: utoipa::PartialSchema>() -> Vec<String> {
    let schema = serde_json::to_value(T::schema()).unwrap_or(Value::Null);
    let mut names: Vec<String> =
        schema["properties"].as_object().into_iter().flatten().map(|(k, _)| k.clone()).collect();
    names.sort();
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        n: u32,
        inner: Option<Inner>,
        #[serde(default)]
        list: Vec<Inner>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        a: Option<u32>,
        b: Option<u32>,
    }

    fn read(json: &str) -> Result<Outer, String> {
        let v = parse_value(json.as_bytes()).map_err(|e| e.to_string())?;
        from_value(v).map_err(|e| e.to_string())
    }

    #[test]
    fn objects_read_as_before() {
        let got = read(r#"{"n": 1, "inner": {"a": 2}, "list": [{"b": 3}]}"#).unwrap();
        assert_eq!(
            got,
            Outer { n: 1, inner: Some(Inner { a: Some(2), b: None }), list: vec![Inner { a: None, b: Some(3) }] }
        );
        assert_eq!(read(r#"{"n": 1, "inner": null}"#).unwrap().inner, None);
    }

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        let e = read(r#"{"n": 1, "n": 2}"#).unwrap_err();
        assert!(e.contains("duplicate key `n`"), "{e}");
        let e = read(r#"{"n": 1, "inner": {"a": 1, "a": 2}}"#).unwrap_err();
        assert!(e.contains("duplicate key `a`") && e.ends_with(" at inner"), "{e}");
        let e = read(r#"{"n": 1, "list": [{"b": 1}, {"b": 1, "b": 2}]}"#).unwrap_err();
        assert!(e.contains("duplicate key `b`") && e.ends_with(" at list[1]"), "{e}");
    }

    #[test]
    fn arrays_never_stand_for_objects() {
        let e = read(r#"{"n": 1, "inner": [null, null]}"#).unwrap_err();
        assert!(e.contains("invalid type: sequence, expected an object at inner"), "{e}");
        let e = read(r#"[1, null, []]"#).unwrap_err();
        assert!(e.contains("expected an object"), "{e}");
        let e = read(r#"{"n": 1, "list": [[1, 2]]}"#).unwrap_err();
        assert!(e.contains("expected an object at list[0]"), "{e}");
    }

    #[test]
    fn numbers_keep_their_range_checks() {
        assert!(read(r#"{"n": -1}"#).unwrap_err().contains("expected u32"));
        assert!(read(r#"{"n": 1.5}"#).unwrap_err().contains("expected u32"));
        assert!(read(r#"{"n": 4294967296}"#).unwrap_err().contains("expected u32"));
    }
}
