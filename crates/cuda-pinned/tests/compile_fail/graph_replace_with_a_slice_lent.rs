//! Claim: a buffer cannot be handed to `Graph::replace` while a slice of it lent by its own accessor is still
//! read (E0502): the graph's launches would write the memory while the host reads it.
use cuda_pinned::{Context, DeviceBuffer, Graph, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let mut host = Pinned::<f32>::zeroed(&context, 4)?;
    let mut spare = Pinned::<f32>::zeroed(&context, 4)?;
    let mut graph = Graph::capture(&[&stream], || stream.download(&device, &mut host))?;
    let seen = spare.as_slice()?;
    graph.replace(&host, &mut spare)?;
    graph.launch(&stream)?;
    println!("{}", seen[0]);
    Ok(())
}

fn main() {
    let _ = run;
}
