//! The mock model server of `tests/common/mock_model.rs` as a program, for recording fixtures
//! and for benchmarks: prints its base URL, then serves until killed.
//!
//! Usage: `mock_model [port]` (default: any free port).

#![allow(clippy::print_stdout, reason = "prints its URL for the caller")]

#[path = "../tests/common/mock_model.rs"]
mod mock_model;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let mock = mock_model::MockModel::start(port).await?;
    println!("{}", mock.base_url());
    std::future::pending::<()>().await;
    Ok(())
}
