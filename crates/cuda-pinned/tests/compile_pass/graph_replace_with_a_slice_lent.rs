//! Twin of compile_fail/graph_replace_with_a_slice_lent.rs: the slice is last used before the replace.
use cuda_pinned::{Context, DeviceBuffer, Graph, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let mut host = Pinned::<f32>::zeroed(&context, 4)?;
    let mut spare = Pinned::<f32>::zeroed(&context, 4)?;
    let mut graph = Graph::capture(&[&stream], || stream.download(&device, &mut host))?;
    let seen = spare.as_slice()?;
    println!("{}", seen[0]);
    graph.replace(&host, &mut spare)?;
    graph.launch(&stream)?;
    Ok(())
}

fn main() {
    let _ = run;
}
