/* Stand-in libcuda for building and loading a CUDA build on a machine with no GPU or driver:
   every driver call answers CUDA_ERROR_NO_DEVICE (100). */
#define NO_DEVICE 100
#define STUB(name) int name(void) { return NO_DEVICE; }
STUB(cuDeviceGet) STUB(cuDeviceGetAttribute) STUB(cuMemAddressFree) STUB(cuMemAddressReserve)
STUB(cuMemCreate) STUB(cuMemGetAllocationGranularity) STUB(cuMemMap) STUB(cuMemRelease)
STUB(cuMemSetAccess) STUB(cuMemUnmap) STUB(cuInit) STUB(cuDriverGetVersion) STUB(cuDeviceGetCount)
STUB(cuGetProcAddress) STUB(cuGetProcAddress_v2)
int cuGetErrorString(int error, const char **text) { (void)error; *text = "no CUDA device (stand-in libcuda)"; return 0; }
