//! Claim: a user type cannot implement the seal (the private supertrait `DeviceMemory`) by its path, even with every method written out, to then implement `DeviceSource` (E0603).
use cuda_pinned::{Context, DeviceBuffer, DeviceSource, Stream};

struct Mine(u64);

impl cuda_pinned::copy::sealed::DeviceMemory for Mine {
    fn device_ptr(&self) -> cuda_pinned::sys::CUdeviceptr {
        self.0
    }
    fn elements(&self) -> usize {
        0
    }
    fn track(&self) -> &cuda_pinned::memory::Track {
        unimplemented!()
    }
    fn owner(&self) -> &Context {
        unimplemented!()
    }
    fn origin(&self) -> cuda_pinned::memory::device::Origin {
        unimplemented!()
    }
}
impl DeviceSource<f32> for Mine {}

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let device = DeviceBuffer::<f32>::uninit(&stream, 4)?;
    let mine = Mine(device.as_raw());
    println!("{}", mine.0);
    Ok(())
}

fn main() {
    let _ = run;
}
