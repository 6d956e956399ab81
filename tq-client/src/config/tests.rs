//! Tests of the configuration: TOML, the environment rule, features, secrets.

use super::*;

#[test]
fn toml_and_env_overrides() {
    let c = Config::from_toml("[storage]\nnum_units = 4\n").unwrap();
    assert_eq!(c.storage.num_units, 4);
    assert_eq!(c.controller, ControllerSection::default());
    assert!(Config::from_toml("[storage]\nnum_unitz = 4\n").is_err());
    assert!(Config::from_toml("[storage]\nnum_units = 0\n").is_err());
    let e = Config::from_toml("[controller]\nmax_samples = 0\n").unwrap_err();
    assert!(e.message().contains("controller.max_samples"), "{e}");
    let c = Config::from_toml("[controller]\nmax_samples = 4096\n").unwrap();
    assert_eq!(c.controller.max_samples, Some(4096));
    let mut c = Config::default();
    c.apply_env(env(&[
        ("TQ_STORAGE_NUM_UNITS", "3"),
        ("TQ_CONTROLLER_DEFAULT_SAMPLER", "grpo:4"),
        ("TQ_REQUIRE_REDIS", "1"),
    ]))
    .unwrap();
    assert_eq!(c.storage.num_units, 3);
    assert_eq!(c.controller.default_sampler, "grpo:4");
    let before = c.clone();
    let e = c
        .apply_env(env(&[("TQ_STORAGE_NUM_UNITS", "x")]))
        .unwrap_err();
    assert!(e.message().contains("TQ_STORAGE_NUM_UNITS"), "{e}");
    assert!(c
        .apply_env(env(&[("TQ_CONTROLLER_DEFAULT_SAMPLER", "nope")]))
        .is_err());
    assert_eq!(c, before, "a refused override changes nothing");
}

fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
    vars.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn every_key_follows_the_environment_rule() {
    let mut c = Config::default();
    c.apply_env(env(&[
        ("TQ_NET_TOKEN", "12345"),
        ("TQ_NET_REQUEST_TIMEOUT_MS", "250"),
        ("TQ_STORAGE_CAPACITY_PER_UNIT", "64"),
        ("TQ_STORAGE_COMPACTION_THRESHOLD", "0.25"),
        ("TQ_CONTROLLER_SAMPLERS_GROUPS", "grpo:8"),
    ]))
    .unwrap();
    assert_eq!(
        c.net.token.as_deref(),
        Some("12345"),
        "a numeric token stays a string"
    );
    assert_eq!(c.net.request_timeout_ms, 250);
    assert_eq!(c.storage.capacity_per_unit, Some(64));
    assert_eq!(c.storage.compaction_threshold, 0.25);
    assert_eq!(c.controller.samplers["groups"], "grpo:8");
    for unknown in ["TQ_STORAGE_NUM_UNITZ", "TQ_NET_TOKENS", "TQ_CONTROLLER_X"] {
        let e = Config::default()
            .apply_env(env(&[(unknown, "1")]))
            .unwrap_err();
        assert_eq!(e.kind(), &tq_core::ErrorKind::Invalid, "{unknown}: {e}");
    }
}

#[cfg(feature = "kv")]
#[test]
fn nested_sections_follow_the_rule_too() {
    let mut c = Config::default();
    c.apply_env(env(&[
        ("TQ_STORAGE_BACKEND", "kv"),
        ("TQ_STORAGE_KV_DATA_TTL_MS", "60000"),
        ("TQ_STORAGE_KV_STORES", "[{ url = \"memory://\" }]"),
        ("TQ_STORAGE_KV_REDIS_DELETE", "del"),
    ]))
    .unwrap();
    assert_eq!(c.storage.backend, Backend::Kv);
    assert_eq!(c.storage.kv.data_ttl_ms, Some(60000));
    assert_eq!(c.storage.kv.stores.len(), 1);
    assert_eq!(c.storage.kv.redis.delete, tq_backend_kv::RedisDelete::Del);
}

#[cfg(feature = "kv")]
#[test]
fn the_storage_description_round_trips() {
    let c = Config::from_toml(
        "[storage]\nbackend = \"kv\"\n[storage.kv]\ndata_ttl_ms = 5000\n\
         stores = [{ name = \"a\", url = \"memory://\" }]\n\
         routing = { kind = \"first\" }\n[net]\ntoken = \"not-in-the-description\"\n",
    )
    .unwrap();
    let text = c.storage_description().unwrap();
    assert!(!text.contains("not-in-the-description"), "{text}");
    // SSD offload off says nothing: a client built without `ssd` would refuse the section.
    assert!(!text.contains("ssd"), "{text}");
    assert_eq!(Config::from_toml(&text).unwrap().storage, c.storage);
    assert!(c.storage_is_shared());
    assert!(!Config::default().storage_is_shared());
}

#[test]
fn debug_output_hides_secrets() {
    let mut c = Config::default();
    c.net.token = Some("t0ken-s3cret".into());
    assert!(!format!("{c:?}").contains("t0ken-s3cret"));
    #[cfg(feature = "kv")]
    {
        let c = Config::from_toml(
            "[storage]\nbackend = \"kv\"\n[storage.kv]\nstores = [{ url = \"redis://:pw-s3cret@127.0.0.1:1\" }]\n",
        )
        .unwrap();
        assert!(!format!("{c:?}").contains("pw-s3cret"));
    }
}

#[test]
fn settings_that_would_be_ignored_are_errors() {
    assert!(Config::from_toml("[storage]\nbackend = \"mine\"\n").is_ok());
    let e =
        Config::from_toml("[storage]\nbackend = \"mine\"\ncapacity_per_unit = 4\n").unwrap_err();
    assert!(e.message().contains("capacity_per_unit"), "{e}");
    assert!(Config::from_toml("[storage]\nbackend = \"no spaces\"\n").is_err());
    #[cfg(feature = "kv")]
    assert!(Config::from_toml("[storage.kv]\ndata_ttl_ms = 5\n").is_err());
    #[cfg(feature = "ssd")]
    assert!(Config::from_toml("[storage.ssd]\nthreshold_bytes = 5\n").is_err());
}

#[cfg(not(feature = "kv"))]
#[test]
fn a_kv_section_without_the_feature_names_the_feature() {
    for text in [
        "[storage]\nbackend = \"kv\"\n",
        "[storage.kv]\ndata_ttl_ms = 5\n",
    ] {
        let e = Config::from_toml(text).unwrap_err();
        assert!(e.message().contains("`kv` feature"), "{e}");
    }
}

#[cfg(not(feature = "ssd"))]
#[test]
fn an_ssd_section_without_the_feature_names_the_feature() {
    let e = Config::from_toml("[storage.ssd]\nenabled = true\n").unwrap_err();
    assert!(e.message().contains("`ssd` feature"), "{e}");
}

#[cfg(feature = "kv")]
#[test]
fn kv_section() {
    let c = Config::from_toml(
        "[storage]\nbackend = \"kv\"\n[storage.kv]\ndata_ttl_ms = 5000\n\
         stores = [{ name = \"a\", url = \"memory://\" }, { name = \"b\", url = \"memory://\" }]\n\
         routing = { kind = \"by-field\", fields = { reward = \"b\" }, default = \"a\" }\n",
    )
    .unwrap();
    assert_eq!(c.storage.backend, Backend::Kv);
    assert_eq!(c.storage.kv.data_ttl_ms, Some(5000));
    assert_eq!(c.storage.kv.stores.len(), 2);
    assert_eq!(c.storage.kv.redis, tq_backend_kv::RedisConfig::default());
    let c = Config::from_toml(
        "[storage]\nbackend = \"kv\"\n[storage.kv.redis]\ndelete = \"del\"\nexpire = \"script\"\n",
    )
    .unwrap();
    assert_eq!(c.storage.kv.redis.delete, tq_backend_kv::RedisDelete::Del);
    assert_eq!(
        c.storage.kv.redis.expire,
        tq_backend_kv::RedisExpire::Script
    );
    assert!(Config::from_toml("[storage.kv.redis]\nexpire = \"lua\"\n").is_err());
    assert!(Config::from_toml(
        "[storage]\nbackend = \"kv\"\n[storage.kv]\nstores = [{ url = \"nope://x\" }]\n"
    )
    .is_err());
    assert_eq!(Config::default().storage.backend, Backend::Simple);
}

/// Leaf keys of a TOML table, as dotted paths (`[]` after a list of tables).
#[cfg(all(feature = "kv", feature = "ssd"))]
fn leaves(table: &toml::Table, prefix: &str, out: &mut Vec<String>) {
    for (k, v) in table {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(t) if !t.is_empty() => leaves(t, &path, out),
            toml::Value::Array(items)
                if items.iter().all(|i| i.is_table()) && !items.is_empty() =>
            {
                for item in items {
                    leaves(item.as_table().unwrap(), &format!("{path}[]"), out);
                }
            }
            _ => out.push(path),
        }
    }
}

/// The reference describes every key the types have: each leaf of the default configuration
/// (with the optional keys set) is in it, and each key in it is one the types accept — its
/// example parses (unknown keys are errors) into something other than the default.
#[cfg(all(feature = "kv", feature = "ssd"))]
#[test]
fn the_configuration_reference_covers_every_key() {
    use reference::KEYS;
    let documented: Vec<&str> = KEYS.iter().map(|k| k.key).collect();
    let mut full = Config::default();
    full.net.token = Some("t".into());
    full.storage.capacity_per_unit = Some(1);
    full.storage.kv.data_ttl_ms = Some(1);
    full.storage.kv.stores[0].name = Some("m".into());
    full.storage.ssd.path = Some("/x".into());
    full.controller
        .samplers
        .insert("<name>".into(), "grpo:2".into());
    let mut keys = Vec::new();
    leaves(&toml::Table::try_from(&full).unwrap(), "", &mut keys);
    for key in &keys {
        assert!(
            documented.contains(&key.as_str()),
            "`{key}` is not in the reference"
        );
    }
    for k in KEYS {
        let parsed: Config = toml::from_str(k.example)
            .unwrap_or_else(|e| panic!("the example of `{}` does not parse: {e}", k.key));
        assert_ne!(
            parsed,
            Config::default(),
            "the example of `{}` changes nothing",
            k.key
        );
        let leaf = k.key.rsplit('.').next().unwrap();
        let leaf = leaf.trim_start_matches('<').trim_end_matches('>');
        assert!(
            k.example.contains(leaf) || k.key.contains('<'),
            "the example of `{}` does not set it",
            k.key
        );
    }
    let unique: std::collections::BTreeSet<&str> = documented.iter().copied().collect();
    assert_eq!(unique.len(), documented.len(), "a key is described twice");
}

/// docs/configuration.md is the generated reference (regenerate it with
/// `cargo run -p tq-cli -- config reference > docs/configuration.md`).
#[cfg(all(feature = "kv", feature = "ssd"))]
#[test]
fn the_configuration_page_is_the_generated_reference() {
    let page = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md");
    let committed = std::fs::read_to_string(&page).unwrap_or_default();
    assert!(
        committed == reference::reference_markdown(),
        "docs/configuration.md differs from the generated reference: run \
         `cargo run -p tq-cli -- config reference > docs/configuration.md`"
    );
}

#[test]
fn servers_stay_awake_setting_comes_from_the_environment() {
    let mut c = Config::default();
    assert_eq!(c.net.server_stay_awake_us, 200);
    c.apply_env(env(&[("TQ_NET_SERVER_STAY_AWAKE_US", "0")]))
        .unwrap();
    assert_eq!(c.net.server_stay_awake_us, 0);
    let e = c
        .apply_env(env(&[("TQ_NET_SERVER_STAY_AWAKE_US", "soon")]))
        .unwrap_err();
    assert!(e.message().contains("TQ_NET_SERVER_STAY_AWAKE_US"), "{e}");
    assert_eq!(
        c.net.server_stay_awake_us, 0,
        "a refused override changes nothing"
    );
}

#[test]
fn servers_run_one_thread_unless_configured_and_the_count_is_checked() {
    let mut c = Config::default();
    assert_eq!(c.net.server_threads, 1);
    c.apply_env(env(&[("TQ_NET_SERVER_THREADS", "4")])).unwrap();
    assert_eq!(c.net.server_threads, 4);
    c.validate().unwrap();
    for bad in [0, 1025] {
        c.net.server_threads = bad;
        let e = c.validate().unwrap_err();
        assert!(e.message().contains("net.server_threads"), "{e}");
        assert!(e.message().contains(&bad.to_string()), "{e}");
    }
    let parsed: Config = toml::from_str("[net]\nserver_threads = 2").unwrap();
    assert_eq!(parsed.net.server_threads, 2);
}
