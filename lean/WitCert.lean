import WitCert.Bands
import WitCert.Radius
import WitCert.TiltTV
import WitCert.TiltEndpoints
import WitCert.TiltBox
import WitCert.Excess
import WitCert.ExcessGrid
import WitCert.Output
import WitCert.SubGaussian
import WitCert.Budget
import WitCert.SplitMerge
import WitCert.Union
import WitCert.FloatTV
import WitCert.Sketch
import WitCert.Request

/-!
# WitCert: the theorems of SPEC §9

One file per SPEC section; the module docstring of each file maps its theorems to the SPEC
sections, the Python reference (`witcert/bounds/`) and the kernel lines that use them.
`proofs_bridge/` parses the statements and checks them against the Python formulas.
-/
