//! Twin of compile_fail/name_track.rs: a public type of the crate is named instead of `Track`.
use cuda_pinned::{Context, Pinned};

fn tracker(_: &cuda_pinned::Pinned<f32>) {}

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
