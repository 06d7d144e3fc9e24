//! Claim: a slice a graph lends of a host buffer it uses cannot be held across a launch of the graph (E0502):
//! the launch could write the memory while the host reads it.
use cuda_pinned::{Context, DeviceBuffer, Graph, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let mut host = Pinned::<f32>::zeroed(&context, 4)?;
    let mut graph = Graph::capture(&[&stream], || stream.download(&device, &mut host))?;
    let seen = graph.host_slice(&host)?;
    graph.launch(&stream)?;
    println!("{}", seen[0]);
    Ok(())
}

fn main() {
    let _ = run;
}
