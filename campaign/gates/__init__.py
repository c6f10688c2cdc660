"""The gates a run passes before it may start: the gate rule, gate classes, the software
stack and its gate, the doctor, and the launch gate."""
