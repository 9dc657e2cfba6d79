//! The hub's frame intake: bytes an agent sends after the WebSocket upgrade (WebSocket frames,
//! yamux inside, stream headers and the control channel's gRPC on top) fed to the hub's end of
//! a real session. Whatever arrives, the session ends when the input does, and nothing panics.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    runtime().block_on(async {
        // A session still running long after its input ended is a hang worth reporting.
        tokio::time::timeout(
            std::time::Duration::from_secs(20),
            tunnel::testing::hub_intake(data),
        )
        .await
        .expect("the session ends when its input does");
    });
});
