//! docs/policy.schema.json (for editors: taplo, VS Code's Even Better TOML) says exactly what
//! the loader accepts: each section's keys are the ones the loader lists when it refuses an
//! unknown one, and every built-in policy's keys are in it. No process is spawned.

use std::collections::BTreeSet;

use serde_json::Value;

fn schema() -> Value {
    let text = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/policy.schema.json"
    ));
    serde_json::from_str(text).expect("the schema is JSON")
}

fn keys(v: &Value) -> BTreeSet<String> {
    v["properties"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect()
}

/// The keys the loader accepts in `section` (top level for ""), from its own error for an
/// unknown key: "unknown field `zzz`, expected one of `a`, `b`".
fn accepted(section: &str) -> BTreeSet<String> {
    let text = if section.is_empty() {
        "zzz = 1\n".to_string()
    } else {
        format!("[{section}]\nzzz = 1\n")
    };
    let err = wfjail::policy::from_source("probe.toml", &text)
        .expect_err("an unknown key is refused")
        .to_string();
    let expected = err
        .split("expected one of ")
        .nth(1)
        .or_else(|| err.split("expected ").nth(1))
        .unwrap_or_else(|| panic!("{err}"));
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(String::from)
        .collect()
}

#[test]
fn the_schema_has_the_loaders_keys_in_every_section() {
    let s = schema();
    assert_eq!(keys(&s), accepted(""), "top level");
    for section in keys(&s) {
        let sub = &s["properties"][&section];
        if sub["type"] == "object" && sub.get("properties").is_some() {
            assert_eq!(keys(sub), accepted(&section), "[{section}]");
        }
    }
}

#[test]
fn every_built_in_policy_uses_only_keys_the_schema_has() {
    let s = schema();
    for (name, text) in wfjail::policy::BUILTINS {
        let doc: toml::Value = toml::from_str(text).unwrap();
        for (key, value) in doc.as_table().unwrap() {
            assert!(s["properties"].get(key).is_some(), "{name}: {key}");
            if let (Some(table), Some(props)) = (
                value.as_table(),
                s["properties"][key]["properties"].as_object(),
            ) {
                for k in table.keys() {
                    assert!(props.contains_key(k), "{name}: {key}.{k}");
                }
            }
        }
    }
}
