//! The environment rule: `TQ_` + a key's path in upper case, `_`-joined, overrides that key.

use super::{Config, ENV_SECTIONS};
use tq_core::{Error, Result};

/// Sets the key an environment variable names. The longest table path whose `TQ_` name
/// prefixes the variable wins; the rest of the name, in lower case, is the key.
pub(super) fn set_from_env(tree: &mut toml::Table, name: &str, raw: &str) -> Result<()> {
    let mut tables: Vec<Vec<String>> = Vec::new();
    collect_tables(tree, &mut Vec::new(), &mut tables);
    let env_name = |path: &[String]| format!("TQ_{}_", path.join("_").to_uppercase());
    let (path, key) = tables
        .iter()
        .filter_map(|path| {
            let rest = name.strip_prefix(&env_name(path))?;
            (!rest.is_empty()).then(|| (path, rest.to_lowercase()))
        })
        .max_by_key(|(path, _)| path.len())
        .ok_or_else(|| Error::invalid(format!("environment variable {name}: names no setting")))?;
    let path = path.clone();
    let table = table_at(tree, &path)?;
    let value = match table.get(&key) {
        Some(toml::Value::String(_)) => toml::Value::String(raw.to_string()),
        Some(existing) => match parse_toml_value(raw) {
            Some(v) if v.same_type(existing) => v,
            _ => {
                return Err(Error::invalid(format!(
                    "environment variable {name}: `{raw}` is not a {}",
                    existing.type_str()
                )))
            }
        },
        None => parse_toml_value(raw).unwrap_or_else(|| toml::Value::String(raw.to_string())),
    };
    let typed = !matches!(value, toml::Value::String(_));
    table.insert(key.clone(), value);
    // A key that was unset (an `Option`) takes the raw string when the parsed value does not fit
    // (a token that looks like a number).
    if typed
        && toml::Value::Table(tree.clone())
            .try_into::<Config>()
            .is_err()
    {
        table_at(tree, &path)?.insert(key, toml::Value::String(raw.to_string()));
    }
    Ok(())
}

fn table_at<'t>(tree: &'t mut toml::Table, path: &[String]) -> Result<&'t mut toml::Table> {
    let Some((first, rest)) = path.split_first() else {
        return Ok(tree);
    };
    match tree.get_mut(first) {
        Some(toml::Value::Table(t)) => table_at(t, rest),
        _ => Err(Error::internal(format!(
            "configuration table `{first}` vanished"
        ))),
    }
}

fn collect_tables(table: &toml::Table, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    if path.is_empty() || ENV_SECTIONS.contains(&path[0].as_str()) {
        if !path.is_empty() {
            out.push(path.clone());
        }
        for (k, v) in table {
            if let toml::Value::Table(t) = v {
                if path.is_empty() && !ENV_SECTIONS.contains(&k.as_str()) {
                    continue;
                }
                path.push(k.clone());
                collect_tables(t, path, out);
                path.pop();
            }
        }
    }
}

fn parse_toml_value(raw: &str) -> Option<toml::Value> {
    let table: toml::Table = toml::from_str(&format!("v = {raw}")).ok()?;
    table.get("v").cloned()
}
