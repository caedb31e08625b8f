#include "textflag.h"

// func int80(trap, a1, a2, a3 uintptr) uintptr
TEXT ·int80(SB),NOSPLIT,$0-40
	MOVQ trap+0(FP), AX
	MOVQ a1+8(FP), BX
	MOVQ a2+16(FP), CX
	MOVQ a3+24(FP), DX
	INT $0x80
	MOVQ AX, ret+32(FP)
	RET

// func int81(trap, a1, a2, a3 uintptr) uintptr
//
// int81 raises the fault a kernel without the 32-bit ABI (ia32_emulation=0)
// raises for "int $0x80": vector 0x81 is not open to user mode, so the CPU
// takes a general protection fault and the kernel sends SIGSEGV.
TEXT ·int81(SB),NOSPLIT,$0-40
	MOVQ trap+0(FP), AX
	MOVQ a1+8(FP), BX
	MOVQ a2+16(FP), CX
	MOVQ a3+24(FP), DX
	INT $0x81
	MOVQ AX, ret+32(FP)
	RET
