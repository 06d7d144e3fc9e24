//! Claim: `Track`, the tracker type the seal's methods return, cannot be named from outside: its module is private (E0603).
use cuda_pinned::{Context, Pinned};

fn tracker(_: &cuda_pinned::memory::Track) {}

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let host = Pinned::<f32>::zeroed(&context, 4)?;
    println!("{}", host.len());
    let _ = tracker;
    Ok(())
}

fn main() {
    let _ = run;
}
