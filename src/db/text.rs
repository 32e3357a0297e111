//! Enums of the domain stored as TEXT columns: each is written as its
//! `as_str` and read back with its `parse`, so that a query binds and
//! decodes the enum itself and an unknown stored value is a decode error,
//! never a string compared somewhere else. The domain stays free of sqlx;
//! the stored text is what it always was, on either store.

use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgValueRef};
use sqlx::sqlite::{SqliteArgumentsBuffer, SqliteTypeInfo, SqliteValueRef};
use sqlx::{Postgres, Sqlite};

use crate::domain::role::Role;
use crate::domain::upgrade::{Component, ComponentState, JobState, StepState, WindDown};

macro_rules! stored_as_text {
    ($($t:ty),* $(,)?) => {$(
        impl sqlx::Type<Sqlite> for $t {
            fn type_info() -> SqliteTypeInfo {
                <str as sqlx::Type<Sqlite>>::type_info()
            }

            fn compatible(ty: &SqliteTypeInfo) -> bool {
                <str as sqlx::Type<Sqlite>>::compatible(ty)
            }
        }

        impl sqlx::Encode<'_, Sqlite> for $t {
            fn encode_by_ref(&self, buf: &mut SqliteArgumentsBuffer) -> Result<IsNull, BoxDynError> {
                <&str as sqlx::Encode<'_, Sqlite>>::encode(self.as_str(), buf)
            }
        }

        impl<'r> sqlx::Decode<'r, Sqlite> for $t {
            fn decode(value: SqliteValueRef<'r>) -> Result<Self, BoxDynError> {
                let text = <&str as sqlx::Decode<'r, Sqlite>>::decode(value)?;
                <$t>::parse(text).ok_or_else(|| format!("{text:?} is not a stored {}", stringify!($t)).into())
            }
        }

        impl sqlx::Type<Postgres> for $t {
            fn type_info() -> PgTypeInfo {
                <str as sqlx::Type<Postgres>>::type_info()
            }

            fn compatible(ty: &PgTypeInfo) -> bool {
                <str as sqlx::Type<Postgres>>::compatible(ty)
            }
        }

        impl sqlx::Encode<'_, Postgres> for $t {
            fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
                <&str as sqlx::Encode<'_, Postgres>>::encode(self.as_str(), buf)
            }
        }

        impl<'r> sqlx::Decode<'r, Postgres> for $t {
            fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
                let text = <&str as sqlx::Decode<'r, Postgres>>::decode(value)?;
                <$t>::parse(text).ok_or_else(|| format!("{text:?} is not a stored {}", stringify!($t)).into())
            }
        }
    )*};
}

stored_as_text!(JobState, Component, ComponentState, StepState, WindDown, Role);

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn enums_are_stored_as_their_names_and_read_back() {
        let db = sqlx::SqlitePool::connect("sqlite::memory:").await.expect("memory database");
        let (text, back): (String, ComponentState) =
            sqlx::query_as("select ?1, ?1").bind(ComponentState::RolledBack).fetch_one(&db).await.expect("query");
        assert_eq!((text.as_str(), back), ("rolled_back", ComponentState::RolledBack));
        let role: Role = sqlx::query_scalar("select 'operator'").fetch_one(&db).await.expect("query");
        assert_eq!(role, Role::Operator);
        let unknown = sqlx::query_scalar::<_, JobState>("select 'paused'").fetch_one(&db).await;
        assert!(unknown.is_err(), "an unknown stored state must not decode");
    }
}
