//! Pure types and rules: names, versions, image references, rollout bounds
//! and pool specs. Nothing here does IO, so every rule is unit-tested alone.

pub mod backoff;
pub mod event;
pub mod grant;
pub mod image;
pub mod json;
pub mod labels;
pub mod machine;
pub mod names;
pub mod object;
pub mod pool;
pub mod role;
pub mod rollout;
pub mod server_url;
pub mod status;
pub mod strategy;
pub mod upgrade;
pub mod version;

use std::fmt;

/// One broken rule, tied to the JSON path of the field that broke it.
/// The server makes them and the CLI reads them (leniently: a proxy or an
/// older server may leave fields out).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct FieldError {
    /// Dotted path of the offending field, e.g. `extra_mounts[1].host_path`.
    #[serde(default)]
    pub field: String,
    /// Stable machine-readable name of the rule, e.g. `dns_label`, `range`.
    #[serde(default)]
    #[schema(value_type = String)]
    pub rule: std::borrow::Cow<'static, str>,
    /// What is wrong, for people.
    #[serde(default)]
    pub message: String,
}

#[cfg(test)]
impl FieldError {
    /// The rule's name for a table of expectations (the server's rules are
    /// all static names).
    pub fn static_rule(&self) -> &'static str {
        match &self.rule {
            std::borrow::Cow::Borrowed(rule) => rule,
            std::borrow::Cow::Owned(rule) => rule.clone().leak(),
        }
    }
}

/// Every rule a request broke, so a user fixes them in one round trip.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ValidationErrors(pub Vec<FieldError>);

impl ValidationErrors {
    pub fn push(&mut self, field: impl Into<String>, rule: &'static str, message: impl fmt::Display) {
        self.0.push(FieldError { field: field.into(), rule: rule.into(), message: message.to_string() });
    }

    pub fn single(field: impl Into<String>, rule: &'static str, message: impl fmt::Display) -> Self {
        let mut e = Self::default();
        e.push(field, rule, message);
        e
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `Ok(value)` when no rule was broken.
    pub fn into_result<T>(self, value: T) -> Result<T, Self> {
        if self.is_empty() { Ok(value) } else { Err(self) }
    }

    /// Both values, or every error of either: so that one answer lists the
    /// rules two parts of a request broke.
    pub fn join<A, B>(a: Result<A, Self>, b: Result<B, Self>) -> Result<(A, B), Self> {
        match (a, b) {
            (Ok(a), Ok(b)) => Ok((a, b)),
            (Err(mut errs), Err(more)) => {
                errs.0.extend(more.0);
                Err(errs)
            }
            (Err(errs), _) | (_, Err(errs)) => Err(errs),
        }
    }
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: {}", e.field, e.message)?;
        }
        Ok(())
    }
}
