//! The legal twins of the programs in `tests/compile_fail/`: each file in `tests/compile_pass/` is the same
//! program as its namesake there with the one fix that makes it legal, and compiles here, as a module of this
//! test (its `main` is never called: the programs are type-checked only), so that each compile failure has the
//! claimed cause only. `tests/compile_fail.rs` checks that every program there has its twin here.
#![allow(
    dead_code,
    reason = "each twin is a program whose `main` and `run` nothing here calls"
)]
#![allow(
    clippy::needless_borrow,
    reason = "each twin differs from its failing program by the one fix only"
)]

#[path = "compile_pass/buffer_assigned_under_view.rs"]
mod buffer_assigned_under_view;

#[path = "compile_pass/buffer_dropped_under_view.rs"]
mod buffer_dropped_under_view;

#[path = "compile_pass/buffer_swapped_under_view.rs"]
mod buffer_swapped_under_view;

#[path = "compile_pass/declared_use_outlives_buffer.rs"]
mod declared_use_outlives_buffer;

#[path = "compile_pass/device_view_outlives_scope.rs"]
mod device_view_outlives_scope;

#[path = "compile_pass/graph_replace_with_a_slice_lent.rs"]
mod graph_replace_with_a_slice_lent;

#[path = "compile_pass/graph_slice_held_across_launch.rs"]
mod graph_slice_held_across_launch;

#[path = "compile_pass/host_read_under_declared_write.rs"]
mod host_read_under_declared_write;

#[path = "compile_pass/impl_device_destination.rs"]
mod impl_device_destination;

#[path = "compile_pass/impl_pinned_source.rs"]
mod impl_pinned_source;

#[path = "compile_pass/impl_sealed_trait.rs"]
mod impl_sealed_trait;

#[path = "compile_pass/launch_reads_and_writes_one_buffer.rs"]
mod launch_reads_and_writes_one_buffer;

#[path = "compile_pass/launch_writes_a_shared_borrow.rs"]
mod launch_writes_a_shared_borrow;

#[path = "compile_pass/mut_slice_held_across_download.rs"]
mod mut_slice_held_across_download;

#[path = "compile_pass/mut_slice_held_across_upload.rs"]
mod mut_slice_held_across_upload;

#[path = "compile_pass/name_sealed_trait.rs"]
mod name_sealed_trait;

#[path = "compile_pass/name_track.rs"]
mod name_track;

#[path = "compile_pass/pinned_forgotten_under_view.rs"]
mod pinned_forgotten_under_view;

#[path = "compile_pass/pinned_replaced_under_view.rs"]
mod pinned_replaced_under_view;

#[path = "compile_pass/pinned_slice_upload.rs"]
mod pinned_slice_upload;

#[path = "compile_pass/pinned_view_outlives_scope.rs"]
mod pinned_view_outlives_scope;

#[path = "compile_pass/read_and_write_views_of_one_buffer.rs"]
mod read_and_write_views_of_one_buffer;

#[path = "compile_pass/read_view_as_download_destination.rs"]
mod read_view_as_download_destination;

#[path = "compile_pass/read_view_as_upload_destination.rs"]
mod read_view_as_upload_destination;

#[path = "compile_pass/registered_slice_held_across_download.rs"]
mod registered_slice_held_across_download;

#[path = "compile_pass/slice_download.rs"]
mod slice_download;

#[path = "compile_pass/slice_held_across_download.rs"]
mod slice_held_across_download;

#[path = "compile_pass/slice_upload.rs"]
mod slice_upload;

#[path = "compile_pass/staging_options_literal.rs"]
mod staging_options_literal;

#[path = "compile_pass/two_mut_device_views.rs"]
mod two_mut_device_views;

#[path = "compile_pass/two_mut_pinned_views.rs"]
mod two_mut_pinned_views;

#[path = "compile_pass/vec_download.rs"]
mod vec_download;

#[path = "compile_pass/vec_upload.rs"]
mod vec_upload;
