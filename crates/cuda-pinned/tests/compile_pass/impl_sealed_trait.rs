//! Twin of compile_fail/impl_sealed_trait.rs: without the impls (the methods become the type's own), the user type and the trait names are legal.
use cuda_pinned::{Context, DeviceBuffer, DeviceSource, Stream};

struct Mine(u64);

impl Mine {
    fn device_ptr(&self) -> cuda_pinned::sys::CUdeviceptr {
        self.0
    }
    fn elements(&self) -> usize {
        0
    }
    fn owner(&self) -> &Context {
        unimplemented!()
    }
}

fn _bound<S: DeviceSource<f32>>(_: &S) {}

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let device = DeviceBuffer::<f32>::uninit(&stream, 4)?;
    let mine = Mine(device.as_raw());
    println!(
        "{} {} {:?}",
        mine.device_ptr(),
        mine.elements(),
        mine.owner()
    );
    Ok(())
}

fn main() {
    let _ = run;
}
