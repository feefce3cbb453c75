//! Hostile input, faults and concurrency: nothing a user, a kernel or a
//! device does hangs or aborts the runtime, and the command line says what
//! it refused in one line.
