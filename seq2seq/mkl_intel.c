/* MKL's answer to "is this an Intel CPU?", always yes: see seq2seq/mkl.py, which loads this
 * library before torch so that libtorch_cpu's calls to the function land here. MKL still
 * chooses its kernels by the CPU's instruction sets (CPUID); only its vendor check changes. */
int mkl_serv_intel_cpu_true(void) { return 1; }
