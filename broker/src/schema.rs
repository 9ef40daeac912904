//! The config schema as data: the key names serde expects for a struct, read
//! from the struct's own `Deserialize` impl, so lists of keys never drift from
//! the code (the bridge-table split and the NixOS module test both use them).

use serde::de::{self, Deserialize, Deserializer, Visitor};

/// The fields a derived `Deserialize` struct accepts.
pub fn field_names<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    let mut fields = None;
    let _ = T::deserialize(Capture(&mut fields));
    fields.unwrap_or(&[])
}

struct Capture<'a>(&'a mut Option<&'static [&'static str]>);

impl<'de> Deserializer<'de> for Capture<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = Some(fields);
        Err(de::Error::custom("fields captured"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

/// Every key path of the shared schema, with `*` for names chosen by the user
/// (`bridges.*.approval.timeout`). Type-specific bridge keys are not included.
pub fn key_paths() -> Vec<String> {
    use crate::config::*;
    let mut out = Vec::new();
    let mut add = |prefix: &str, fields: &[&str]| {
        out.extend(fields.iter().map(|f| format!("{prefix}{f}")));
    };
    add("redis.", field_names::<RedisConfig>());
    add("agents.*.", field_names::<AgentConfig>());
    add("operators.*.", field_names::<OperatorConfig>());
    add("people.*.", field_names::<PersonConfig>());
    add("audit.", field_names::<AuditConfig>());
    for f in field_names::<WebConfig>() {
        match *f {
            "users" => add("web.users.*.", field_names::<WebUserConfig>()),
            other => add("web.", &[other]),
        }
    }
    for f in field_names::<BridgeCommon>() {
        match *f {
            "approval" => add("bridges.*.approval.", field_names::<ApprovalConfig>()),
            "ping" => add("bridges.*.ping.", field_names::<PingConfig>()),
            "redis_password_files" => add(
                "bridges.*.redis_password_files.",
                field_names::<ServicePasswords>(),
            ),
            other => add("bridges.*.", &[other]),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn key_paths_cover_the_nested_tables() {
        let paths = super::key_paths();
        for p in [
            "redis.url",
            "agents.*.password_file",
            "bridges.*.type",
            "bridges.*.approval.timeout",
            "bridges.*.ping.command",
        ] {
            assert!(paths.contains(&p.to_string()), "{p} in {paths:?}");
        }
    }
}
