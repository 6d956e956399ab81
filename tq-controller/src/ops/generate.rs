//! The generator behind the operation table (`ops.rs`): [`control_ops!`] turns the table into
//! the [`crate::ControlPlane`] and [`crate::ControlAdmin`] traits, [`crate::ControllerOp`]
//! (the `op_type` labels), the metering of [`crate::MeteredPlane`], and with feature `net`
//! the wire request enum, what each request means for `--state-dir`, the remote stub and the
//! server's dispatch. Nothing here knows any one operation; the table says everything.
//!
//! A declarative macro rather than a derive: it needs no proc-macro crate (builds stay lean),
//! and what it generates is ordinary code a reader can expand with `cargo expand`.

pub use tq_core::Resend;

/// Metering: the request counts no samples.
pub(crate) fn no_rows<T>(_: &T) -> u64 {
    0
}

/// Metering: the request counts `n` samples (known from its arguments).
pub(crate) fn rows<T>(n: usize) -> impl FnOnce(&T) -> u64 {
    move |_| n as u64
}

/// Metering: the reply is the number of samples.
pub(crate) fn counted(n: &usize) -> u64 {
    *n as u64
}

/// Metering: every error counts as a failed request.
pub(crate) fn any_error(_: &tq_core::Error) -> bool {
    true
}

#[cfg(feature = "net")]
pub(crate) use wire_args::{AsArg, ToWire};

/// How arguments cross between a trait method and its wire request (feature `net` only).
#[cfg(feature = "net")]
mod wire_args {
    use std::collections::BTreeMap;

    /// A borrowed argument of a trait method as the owned value its request carries.
    pub(crate) trait ToWire<W> {
        fn to_wire(self) -> W;
    }

    impl ToWire<String> for &str {
        fn to_wire(self) -> String {
            self.to_owned()
        }
    }

    impl<T: Clone> ToWire<Vec<T>> for &[T] {
        fn to_wire(self) -> Vec<T> {
            self.to_vec()
        }
    }

    impl ToWire<Option<String>> for Option<&str> {
        fn to_wire(self) -> Option<String> {
            self.map(str::to_owned)
        }
    }

    impl<T: Clone> ToWire<Option<Vec<T>>> for Option<&[T]> {
        fn to_wire(self) -> Option<Vec<T>> {
            self.map(<[T]>::to_vec)
        }
    }

    impl<K: Clone, V: Clone> ToWire<BTreeMap<K, V>> for &BTreeMap<K, V> {
        fn to_wire(self) -> BTreeMap<K, V> {
            self.clone()
        }
    }

    /// An owned value of a request as the borrowed argument of the trait method it calls.
    pub(crate) trait AsArg<'a, A> {
        fn as_arg(&'a self) -> A;
    }

    impl<'a> AsArg<'a, &'a str> for String {
        fn as_arg(&'a self) -> &'a str {
            self
        }
    }

    impl<'a, T> AsArg<'a, &'a [T]> for Vec<T> {
        fn as_arg(&'a self) -> &'a [T] {
            self
        }
    }

    impl<'a> AsArg<'a, Option<&'a str>> for Option<String> {
        fn as_arg(&'a self) -> Option<&'a str> {
            self.as_deref()
        }
    }

    impl<'a, T> AsArg<'a, Option<&'a [T]>> for Option<Vec<T>> {
        fn as_arg(&'a self) -> Option<&'a [T]> {
            self.as_deref()
        }
    }

    impl<'a, K, V> AsArg<'a, &'a BTreeMap<K, V>> for BTreeMap<K, V> {
        fn as_arg(&'a self) -> &'a BTreeMap<K, V> {
            self
        }
    }
}

/// `$given` when the table gives one, else `$default`.
macro_rules! given_or {
    ($default:expr) => {
        $default
    };
    ($default:expr, $given:expr) => {
        $given
    };
}

/// The type a request carries for an argument: its owned form (`=> T`) or the argument's own.
#[cfg(feature = "net")]
macro_rules! wire_ty {
    ($ty:ty) => {
        $ty
    };
    ($ty:ty, $wire:ty) => {
        $wire
    };
}

/// An argument as its request carries it.
#[cfg(feature = "net")]
macro_rules! to_wire {
    ($arg:ident) => {
        $arg
    };
    ($arg:ident, $wire:ty) => {
        $crate::ops::generate::ToWire::<$wire>::to_wire($arg)
    };
}

/// A request's value as the argument of the method it calls.
#[cfg(feature = "net")]
macro_rules! as_arg {
    ($arg:ident) => {
        $arg
    };
    ($arg:ident, $wire:ty) => {
        $crate::ops::generate::AsArg::as_arg(&$arg)
    };
}

/// Generates everything an operation needs from the table in `ops.rs`; see its docs for the
/// grammar and what each part means.
macro_rules! control_ops {
    (
        data {
            $(
                $(#[$doc:meta])*
                fn $method:ident($($arg:ident: $ty:ty $(=> $wire:ty)?),* $(,)?) -> $reply:ty {
                    wire: $variant:ident,
                    metric: $metric:ident = $label:literal,
                    $(metric_of: $metric_of:expr,)?
                    rows: $rows:expr,
                    $(failed: $failed:expr,)?
                    resend: $resend:expr,
                    $(wait: $wait:expr,)?
                    changes: $changes:expr,
                    $(check: $check:expr,)?
                }
            )*
        }
        admin {
            $(
                $(#[$admin_doc:meta])*
                fn $admin_method:ident($($admin_arg:ident: $admin_ty:ty),* $(,)?) -> $admin_reply:ty;
            )*
        }
        server {
            $(
                $(#[$server_doc:meta])*
                $server_variant:ident
                    $(($($server_tuple:ty),* $(,)?))?
                    $({ $($server_field:ident: $server_fty:ty),* $(,)? })?
                    => metric: $server_metric:ident, changes: $server_changes:literal;
            )*
        }
        labels {
            $($(#[$label_doc:meta])* $extra_label:ident = $extra_name:literal,)*
        }
    ) => {
        /// The control plane's data path as clients see it: embedded ([`crate::Controller`]),
        /// metered ([`crate::MeteredPlane`]) or remote (`RemoteControlPlane`), one trait so
        /// client code has one path. Generated from the operation table (`ops.rs`); the
        /// administrative operations are [`ControlAdmin`], which every plane also implements.
        #[async_trait::async_trait]
        pub trait ControlPlane: ControlAdmin {
            /// The epoch of the controller's state (see `tq_core::new_epoch`); 0 for a remote
            /// stub that has not asked for the topology yet.
            fn epoch(&self) -> u64;

            $(
                $(#[$doc])*
                async fn $method(&self, $($arg: $ty),*) -> tq_core::Result<$reply>;
            )*

            /// Step 3 of a clear for a caller that need not wait for the answer: the samples'
            /// cells are already gone from storage (so the order hide → delete → release holds
            /// at the controller whatever happens next). A remote stub sends the release and
            /// returns at once; every later request of the stub (and its clones) waits for that
            /// answer before it is sent, so the client never sees its own clear unfinished. A
            /// release that fails then leaves the samples hidden, as a failed storage step
            /// does: the next put or clear of their keys, or a clear of the partition, finishes
            /// them. In process it is [`ControlPlane::release`] itself (a call, no round trip
            /// to save). Decision 0044.
            async fn release_behind(
                &self,
                partition: &str,
                samples: &[tq_core::SampleId],
            ) -> tq_core::Result<()> {
                self.release(partition, samples).await
            }

            /// Waits until every request sent behind an answer
            /// ([`ControlPlane::release_behind`]) has been answered (or has failed). For a
            /// client about to stop: a runtime shut down under such a request drops it.
            async fn settle(&self) {}
        }

        /// The control plane's administrative operations — checkpoints (snapshots, holds on
        /// removals, restores) and status — for operators and the checkpoint code rather than
        /// the data path. Generated from the operation table (`ops.rs`).
        #[async_trait::async_trait]
        pub trait ControlAdmin: Send + Sync + 'static {
            $(
                $(#[$admin_doc])*
                async fn $admin_method(&self, $($admin_arg: $admin_ty),*) -> tq_core::Result<$admin_reply>;
            )*
        }

        /// The controller's operation types, as the `op_type` label of
        /// `tq_controller_request_*` spells them (see [`ControllerOp::name`]).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[non_exhaustive]
        pub enum ControllerOp {
            $(
                #[doc = concat!("`", $label, "`: [`ControlPlane::", stringify!($method), "`].")]
                $metric,
            )*
            $($(#[$label_doc])* $extra_label,)*
        }

        impl ControllerOp {
            /// Every operation type, in the order [`ControllerOp::index`] numbers them.
            pub const ALL: &'static [ControllerOp] = &[
                $(ControllerOp::$metric,)*
                $(ControllerOp::$extra_label,)*
            ];

            /// The `op_type` label value.
            pub fn name(self) -> &'static str {
                match self {
                    $(ControllerOp::$metric => $label,)*
                    $(ControllerOp::$extra_label => $extra_name,)*
                }
            }

            /// Position in [`ControllerOp::ALL`] (the discriminant: `ALL` lists them in order).
            pub fn index(self) -> usize {
                self as usize
            }

            /// The request meter of the controller role, with every operation type registered.
            pub fn meter() -> tq_core::telemetry::RequestMeter {
                let names: Vec<&'static str> = ControllerOp::ALL.iter().map(|op| op.name()).collect();
                tq_core::telemetry::RequestMeter::new("controller", &names)
            }
        }

        /// Every data-path operation records `tq_controller_request_*` under its `op_type`;
        /// administrative ones pass through unmetered (as in the original, where checkpoint
        /// requests are not metered).
        #[async_trait::async_trait]
        impl<P: ControlPlane + ?Sized> ControlPlane for $crate::MeteredPlane<P> {
            fn epoch(&self) -> u64 {
                self.inner().epoch()
            }

            $(
                #[allow(unused_variables)]
                async fn $method(&self, $($arg: $ty),*) -> tq_core::Result<$reply> {
                    let op: ControllerOp = given_or!(ControllerOp::$metric $(, $metric_of)?);
                    self.meter()
                        .measure_with(
                            op.index(),
                            $rows,
                            given_or!($crate::ops::generate::any_error $(, $failed)?),
                            self.inner().$method($($arg),*),
                        )
                        .await
                }
            )*
        }

        #[async_trait::async_trait]
        impl<P: ControlPlane + ?Sized> ControlAdmin for $crate::MeteredPlane<P> {
            $(
                async fn $admin_method(&self, $($admin_arg: $admin_ty),*) -> tq_core::Result<$admin_reply> {
                    self.inner().$admin_method($($admin_arg),*).await
                }
            )*
        }

        /// Every controller request on the wire (protocol 7: the order of the variants and of
        /// their fields is the encoding, pinned by `net/wire_pin.rs`).
        #[cfg(feature = "net")]
        #[derive(Debug, serde::Serialize, serde::Deserialize)]
        pub(crate) enum ControlRequest {
            $(
                #[doc = concat!("[`ControlPlane::", stringify!($method), "`].")]
                $variant { $($arg: wire_ty!($ty $(, $wire)?)),* },
            )*
            $(
                $(#[$server_doc])*
                $server_variant $(($($server_tuple),*))? $({ $($server_field: $server_fty),* })?,
            )*
        }

        #[cfg(feature = "net")]
        impl ControlRequest {
            /// The operation type this request counts as.
            #[allow(unused_variables)]
            pub(crate) fn op(&self) -> ControllerOp {
                match self {
                    $(ControlRequest::$variant { $($arg),* } => {
                        given_or!(ControllerOp::$metric $(, $metric_of)?)
                    })*
                    $(ControlRequest::$server_variant { .. } => ControllerOp::$server_metric,)*
                }
            }

            /// Whether a successful request of this kind may have changed the controller's
            /// state (which `--state-dir` must then make durable before answering).
            #[allow(unused_variables)]
            pub(crate) fn changes_state(&self) -> bool {
                match self {
                    $(ControlRequest::$variant { $($arg),* } => $changes,)*
                    $(ControlRequest::$server_variant { .. } => $server_changes,)*
                }
            }
        }

        /// Serves a data-path request on `plane`; a server-level request (registration,
        /// topology, checkpoints, status) comes back for the server to answer.
        #[cfg(feature = "net")]
        pub(crate) async fn dispatch(
            plane: &$crate::MeteredPlane<$crate::Controller>,
            request: ControlRequest,
        ) -> std::result::Result<tq_core::Result<$crate::net::ControlResponse>, ControlRequest> {
            use $crate::net::WireReply as _;
            Ok(match request {
                $(ControlRequest::$variant { $($arg),* } => plane
                    .$method($(as_arg!($arg $(, $wire)?)),*)
                    .await
                    .map(|reply| reply.into_response()),)*
                #[allow(unreachable_patterns)]
                other => return Err(other),
            })
        }

        #[cfg(feature = "net")]
        #[async_trait::async_trait]
        impl ControlPlane for $crate::RemoteControlPlane {
            fn epoch(&self) -> u64 {
                $crate::RemoteControlPlane::epoch(self)
            }

            async fn release_behind(
                &self,
                partition: &str,
                samples: &[tq_core::SampleId],
            ) -> tq_core::Result<()> {
                $crate::RemoteControlPlane::release_behind(self, partition, samples).await
            }

            async fn settle(&self) {
                $crate::RemoteControlPlane::settle(self).await
            }

            $(
                async fn $method(&self, $($arg: $ty),*) -> tq_core::Result<$reply> {
                    let resend: $crate::Resend = $resend;
                    let wait: std::time::Duration = given_or!(std::time::Duration::ZERO $(, $wait)?);
                    let request = ControlRequest::$variant { $($arg: to_wire!($arg $(, $wire)?)),* };
                    let answer = self.send_op(request, resend, wait).await?;
                    match <$reply as $crate::net::WireReply>::from_response(answer) {
                        Ok(reply) => {
                            $(
                                if !($check)(&reply) {
                                    return Err(self.unexpected(
                                        stringify!($method),
                                        <$reply as $crate::net::WireReply>::into_response(reply),
                                    ));
                                }
                            )?
                            Ok(reply)
                        }
                        Err(other) => Err(self.unexpected(stringify!($method), *other)),
                    }
                }
            )*
        }
    };
}
