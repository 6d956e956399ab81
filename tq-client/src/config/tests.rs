//! Tests of the configuration: TOML, the environment rule, features, secrets.

use super::*;

#[test]
fn toml_and_env_overrides() {
    let c = Config::from_toml("[storage]\nnum_units = 4\n").unwrap();
    assert_eq!(c.storage.num_units, 4);
    assert_eq!(c.controller, ControllerSection::default());
    assert!(Config::from_toml("[storage]\nnum_unitz = 4\n").is_err());
    assert!(Config::from_toml("[storage]\nnum_units = 0\n").is_err());
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
