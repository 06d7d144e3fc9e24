//! Twin of compile_fail/graph_slice_held_across_launch.rs: the slice is last used before the launch.
use cuda_pinned::{Context, DeviceBuffer, Graph, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let mut host = Pinned::<f32>::zeroed(&context, 4)?;
    let mut graph = Graph::capture(&[&stream], || stream.download(&device, &mut host))?;
    let seen = graph.host_slice(&host)?;
    println!("{}", seen[0]);
    graph.launch(&stream)?;
    Ok(())
}

fn main() {
    let _ = run;
}
