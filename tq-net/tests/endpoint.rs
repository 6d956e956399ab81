//! Endpoint URLs: parsing, display, serde, loopback detection.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
use std::path::PathBuf;
use tq_core::ErrorKind;
use tq_net::Endpoint;

#[test]
fn parses_and_displays_the_same_url() {
    for url in [
        "tcp://127.0.0.1:7000",
        "tcp://localhost:0",
        "tcp://[::1]:65535",
        "tcp://storage-3.cluster.internal:7100",
        "unix:///run/tq/controller.sock",
    ] {
        let e: Endpoint = url.parse().expect(url);
        assert_eq!(e.to_string(), url);
    }
    assert_eq!(
        "tcp://10.1.2.3:80".parse::<Endpoint>().expect("tcp"),
        Endpoint::Tcp("10.1.2.3:80".into())
    );
    assert_eq!(
        "unix:///tmp/a.sock".parse::<Endpoint>().expect("unix"),
        Endpoint::Unix(PathBuf::from("/tmp/a.sock"))
    );
}

#[test]
fn rejects_malformed_urls_with_a_message_naming_them() {
    for bad in [
        "127.0.0.1:7000",
        "http://127.0.0.1:7000",
        "tcp://127.0.0.1",
        "tcp://127.0.0.1:",
        "tcp://127.0.0.1:70000",
        "tcp://:7000",
        "tcp://::1:7000",
        "tcp://[::1:7000",
        "tcp://[not-v6]:7000",
        "tcp://host/path:7000",
        "unix://relative/path.sock",
        "unix://",
        "",
    ] {
        let err = bad.parse::<Endpoint>().expect_err(bad);
        assert_eq!(err.kind(), &ErrorKind::Invalid, "{bad}");
        assert!(err.message().contains(&format!("`{bad}`")), "{bad}: {err}");
    }
}

#[test]
fn serde_uses_the_url_string() {
    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct Units {
        units: Vec<Endpoint>,
    }
    let units = Units {
        units: vec![
            "tcp://127.0.0.1:7001".parse().expect("tcp"),
            "unix:///tmp/u.sock".parse().expect("unix"),
        ],
    };
    let bytes = postcard::to_allocvec(&units).expect("encode");
    assert_eq!(
        postcard::from_bytes::<Units>(&bytes).expect("decode"),
        units
    );
    // A bad URL in the bytes is a decode error, not a bogus endpoint.
    let bad = postcard::to_allocvec(&vec!["ftp://x:1".to_owned()]).expect("encode");
    assert!(postcard::from_bytes::<Units>(&bad).is_err());
}

#[test]
fn loopback_detection() {
    let yes = [
        "tcp://127.0.0.1:1",
        "tcp://127.8.9.10:1",
        "tcp://[::1]:1",
        "tcp://localhost:1",
        "tcp://LocalHost:1",
        "unix:///tmp/x.sock",
    ];
    let no = [
        "tcp://0.0.0.0:1",
        "tcp://[::]:1",
        "tcp://10.0.0.1:1",
        "tcp://192.168.1.1:1",
        "tcp://8.8.8.8:1",
        "tcp://[2001:db8::1]:1",
    ];
    for url in yes {
        assert!(url.parse::<Endpoint>().expect(url).is_loopback(), "{url}");
    }
    for url in no {
        assert!(!url.parse::<Endpoint>().expect(url).is_loopback(), "{url}");
    }
}
